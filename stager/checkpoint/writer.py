"""CheckpointWriter: a DCP storage writer whose save waits for node-local disk only.

It is DCP's own ``FileSystemWriter`` pointed at the checkpoint's folder in the
staging directory (:mod:`.staging`), so the files it writes are exactly DCP's
layout (``__R_N.distcp`` per rank, ``.metadata``). Its file system hashes
every byte on its way to the disk (stager's xxh3 block digests) and keeps
each file's record beside it once the file is written and fsynced. When the
save's ``finish`` has written ``.metadata``, the checkpoint is sealed and
handed to the drain: the node daemon's when one runs, else a drainer process
that outlives this one (:mod:`.drainer`). ``save`` then returns; the drain
sends it, verified, to the destination and every replica.

Before any rank writes, it asks the staging directory for room for its bytes
(:meth:`~.staging.StagingDir.make_room`): checkpoints already at every store
make way, oldest first; otherwise the save waits up to ``wait_for_room``
seconds for the drain, then fails with :class:`~stager.errors.StagingFull`.
"""

from __future__ import annotations

import io
import os
from collections.abc import Generator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem, _item_size
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult

from ..config import DEFAULT_BLOCK_SIZE, SourceConfig
from ..errors import CheckpointError
from ..hashing import StreamHasher
from .manifest import METADATA_NAME, hash_file, write_record
from .manifest import FileRecord
from .staging import DrainSpec, Entry, StagingDir

#: Bytes a save may write beyond its tensors' own (torch.save's zip framing, .metadata, records).
_SLACK = 1 << 20
DRAIN_MODES = ("auto", "process", "none")


class _HashingStream(io.RawIOBase):
    """A file being written, hashed on the way; its record is kept once it is closed."""

    def __init__(self, path: Path, folder: Path, block_size: int) -> None:
        self._file = open(path, "wb")
        self._path = path
        self._folder = folder
        self._block_size = block_size
        self._hasher = StreamHasher(block_size)
        self._moved = False  # a seek breaks the streaming hash: the file is hashed again at the end

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = self._file.write(view)
        if not self._moved:
            self._hasher.update(view[:n] if n is not None else view)
        return n

    def tell(self) -> int:
        return self._file.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        position = self._file.seek(offset, whence)
        if position != self._hasher.size:
            self._moved = True
        return position

    def fileno(self) -> int:
        return self._file.fileno()

    def flush(self) -> None:
        if not self._file.closed:
            self._file.flush()

    def close(self) -> None:
        if self._file.closed:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        super().close()
        name = self._path.name
        if self._moved or self._hasher.size != os.path.getsize(self._path):
            record = hash_file(self._path, name, self._block_size)
        else:
            digest, blocks = self._hasher.finish()
            record = FileRecord(name, self._hasher.size, digest, tuple(blocks))
        write_record(self._folder, record)


class _HashingFileSystem(FileSystem):
    """DCP's local file system, but data files are hashed as they are written."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        path = Path(path)
        if "w" not in mode or path.name.endswith(".tmp"):  # DCP's .metadata.tmp: hashed once renamed
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        stream = _HashingStream(path, path.parent, self.block_size)
        try:
            yield stream
        finally:
            stream.close()


class CheckpointWriter(FileSystemWriter):
    """A ``torch.distributed.checkpoint`` storage writer that stages locally and drains in the background.

    Args:
        url: the checkpoint's destination (any fsspec URL): one folder per checkpoint, as for
            ``FileSystemWriter``; ``dcp.save(..., checkpoint_id=URL)`` sets it per save.
        staging_dir: node-local directory (NVMe, ``/dev/shm``) for saves waiting to drain.
        replicas: more URLs that get the same checkpoint.
        storage_options: the destination's options (endpoint, keys).
        replica_options: per replica URL, its options; by default the destination's.
        staging_capacity: bytes the staging directory may hold; None: its disk's free room.
        wait_for_room: seconds a save waits for the drain to free room before it fails.
        drain: ``"auto"`` (the daemon when one runs, else a drainer process), ``"process"``
            (a drainer process) or ``"none"`` (queue only: a later drain sends it).
        kwargs: passed to ``FileSystemWriter`` (``thread_count``, ``sync_files``...).

    Raises:
        StagingFull: (from ``save``) no room came in time.
        ConfigError, CheckpointError: bad arguments.
    """

    def __init__(self, url: str, *, staging_dir: str | os.PathLike[str], replicas: Sequence[str] = (),
                 storage_options: Mapping[str, Any] | None = None,
                 replica_options: Mapping[str, Mapping[str, Any]] | None = None,
                 staging_capacity: int | None = None, wait_for_room: float = 600.0, drain: str = "auto",
                 block_size: int = DEFAULT_BLOCK_SIZE, **kwargs: Any) -> None:
        if drain not in DRAIN_MODES:
            raise CheckpointError(f"drain must be one of {', '.join(DRAIN_MODES)}, got {drain!r}")
        if wait_for_room < 0:
            raise CheckpointError(f"wait_for_room must be >= 0 seconds, got {wait_for_room}")
        self.staging = StagingDir(staging_dir, staging_capacity)
        self.url = str(url).rstrip("/")
        super().__init__(self.staging.entry(self.url).path, **kwargs)
        self.fs = _HashingFileSystem(block_size)
        self.replicas = tuple(str(r).rstrip("/") for r in replicas)
        self.storage_options = dict(storage_options or {})
        self.replica_options = {str(k).rstrip("/"): dict(v) for k, v in (replica_options or {}).items()}
        self.wait_for_room = wait_for_room
        self.drain = drain
        self.is_coordinator = False

    # -- where this save goes ------------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(None)
        if checkpoint_id:
            self.url = str(checkpoint_id).rstrip("/")
            self.path = self.staging.entry(self.url).path

    @property
    def checkpoint_id(self) -> str:
        return self.url

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return bool(str(checkpoint_id))

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.url, save_id=self.save_id)

    def _spec(self) -> DrainSpec:
        targets = [SourceConfig(self.url, self.storage_options)]
        for replica in self.replicas:
            targets.append(SourceConfig(replica, self.replica_options.get(replica, self.storage_options)))
        return DrainSpec(tuple(targets))

    # -- the save --------------------------------------------------------------------------

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        entry = Entry(self.path)
        if entry.path.exists() and self.is_coordinator:
            if entry.sealed_at is not None and not entry.drained:
                raise CheckpointError(f"{self.url}: an earlier save to this URL is still draining "
                                      f"(staged at {entry.path}); save under a new checkpoint id")
            entry.remove()  # drained already, or a save killed before it was sealed: its bytes count for nothing
        needed = sum(_item_size(item) for item in plan.items if item.tensor_data is not None) + _SLACK
        self.staging.make_room(needed, keep=entry, timeout=self.wait_for_room, kick=self._kick)
        return super().prepare_local_plan(plan)

    def write_data(self, plan: SavePlan, planner: SavePlanner):  # type: ignore[override]
        self.path.mkdir(parents=True, exist_ok=True)
        Entry(self.path).write_spec(self._spec())
        return super().write_data(plan, planner)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        super().finish(metadata, results)
        write_record(self.path, hash_file(self.path / METADATA_NAME, METADATA_NAME, self.fs.block_size))
        Entry(self.path).seal()
        self._kick()

    def _kick(self) -> None:
        """Have the staging directory drained: by the daemon when one runs, else by a drainer process."""
        if self.drain == "none":
            return
        if self.drain == "auto":
            from .daemon_hook import ask_daemon_to_drain

            if ask_daemon_to_drain(self.staging.root):
                return
        from .drainer import spawn_drainer

        spawn_drainer(self.staging.root)
