"""Where a replication keeps its local state, and the lock that makes one run at a time use it.

The state directory is on the machine running the copy, never on the
destination: default ``$XDG_STATE_HOME/stager/replicate/<xxh3-64 of SRC and DST>/``
(``~/.local/state/stager/replicate/...`` without it), or ``--state-dir``;
state that older versions left in ``~/.cache/stager/replicate`` is moved there
first. It holds the journal (shared by the shards of the replication that run
on this machine), one plan database per shard, the
manifest built on the fly for a source without one, and per-shard lock files.
A second run of the same shard while one is running fails at once instead of
racing it for the same uploads.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import xxhash

from ..config import LEGACY_STATE_ROOT, default_state_root, move_legacy_replicate_state
from ..errors import ReplicationBusy, StagerError
from .shards import Shard


def state_dir_for(src_url: str, dst_url: str, override: str | os.PathLike[str] | None = None) -> Path:
    """The state directory of replicating ``src_url`` to ``dst_url``."""
    if override:
        return Path(override).expanduser()
    key = xxhash.xxh3_64_hexdigest(f"{src_url}\n{dst_url}".encode())
    move_legacy_replicate_state()
    legacy = Path(LEGACY_STATE_ROOT).expanduser() / key
    return legacy if legacy.is_dir() else default_state_root() / key


class RunLock:
    """An exclusive ``flock`` on ``<state>/lock-<shard>``, held until :meth:`release` (or process death).

    Raises:
        ReplicationBusy: another process holds it.
    """

    def __init__(self, state_dir: Path, shard: Shard) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / f"lock-{shard.label}"
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ReplicationBusy(f"{state_dir}: shard {shard} of this replication is already running "
                                  f"(pid {holder}); wait for it or use another --state-dir") from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
