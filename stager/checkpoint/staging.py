"""The staging directory: node-local checkpoints waiting for (or done with) their drain, and its room.

Layout: one folder per checkpoint, named from its destination URL (so every
rank of a save on this node writes into the same one), holding DCP's own files
and a ``.stager/`` folder:

- ``files/NAME.json``: each file's digests, made while it was written;
- ``drain.json``: where it goes (destination and replicas, each with its own
  storage options; mode 0600, as those may hold keys) and, for a save whose
  ranks are on several nodes, which part of it this node holds
  (:mod:`.parts`);
- ``ranks/R``: rank R of a multi-node save finished writing here (the last
  of a part's ranks seals it; rank 0's part is sealed after ``.metadata``);
- ``sealed``: written once the save is complete (after DCP's ``.metadata``);
  its time orders the drain, oldest first;
- ``journal``: the drain's progress (:mod:`.journal`);
- ``drained``: every store holds the checkpoint, verified.

Room: a save states the bytes it is about to write; when the directory's
capacity (a number of bytes, or the free room of its disk) cannot take them,
checkpoints already drained are removed, oldest first, and then the save
waits, bounded, for the drain to finish more of them. A checkpoint that is
not drained is never removed to make room: the save fails with
:class:`~stager.errors.StagingFull` instead.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import xxhash

from ..config import SourceConfig
from ..errors import CheckpointError, StagingFull
from .manifest import write_durably
from .parts import SavePart

SPEC = ".stager/drain.json"
SEALED = ".stager/sealed"
DRAINED = ".stager/drained"
RANKS = ".stager/ranks"
_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class DrainSpec:
    """Where one checkpoint goes: the destination first, then each replica."""

    targets: tuple[SourceConfig, ...]
    source_dir: str | None = None  # a folder drained in place (``stager checkpoints drain``), else the entry itself
    part: SavePart | None = None  # this node's part of a save whose ranks are on several nodes
    part_wait: float = 3600.0  # part 0: seconds a drain waits for the other nodes' parts before it gives up

    def to_json(self) -> dict:
        return {"targets": [{"url": t.url, "storage_options": dict(t.storage_options)} for t in self.targets],
                "source_dir": self.source_dir, "part": self.part.to_json() if self.part else None,
                "part_wait": self.part_wait}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> DrainSpec:
        try:
            targets = tuple(SourceConfig(t["url"], dict(t.get("storage_options") or {})) for t in obj["targets"])
            source_dir = obj.get("source_dir")
            part = SavePart.from_json(obj["part"], where) if obj.get("part") is not None else None
            part_wait = float(obj.get("part_wait", 3600.0))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise CheckpointError(f"{where}: not a drain description ({exc!r} missing or malformed)") from exc
        if not targets:
            raise CheckpointError(f"{where}: a drain needs at least one store")
        return cls(targets, source_dir, part, part_wait)


class Entry:
    """One checkpoint's folder in the staging directory."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def data_dir(self) -> Path:
        """Where its files are: the entry itself, or the folder it drains in place."""
        spec = self.spec()
        return Path(spec.source_dir) if spec.source_dir else self.path

    def spec(self) -> DrainSpec:
        where = str(self.path / SPEC)
        try:
            return DrainSpec.from_json(json.loads((self.path / SPEC).read_bytes()), where)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{where}: unreadable drain description: {exc}") from exc

    def write_spec(self, spec: DrainSpec) -> None:
        write_durably(self.path / SPEC, json.dumps(spec.to_json()).encode(), mode=0o600)

    @property
    def sealed_at(self) -> float | None:
        try:
            return float((self.path / SEALED).read_text())
        except (OSError, ValueError):
            return None

    def seal(self) -> None:
        write_durably(self.path / SEALED, repr(time.time()).encode())

    def finish_rank(self, rank: int, ranks: tuple[int, ...]) -> bool:
        """Record that ``rank`` finished writing here; True for the one rank that finds all ``ranks`` done.

        That rank seals the part (under a lock, so a part is sealed once however its ranks interleave).
        """
        folder = self.path / RANKS
        write_durably(folder / str(rank), b"")
        fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            done = {p.name for p in folder.iterdir()}
            if self.sealed_at is not None or not all(str(r) in done for r in ranks):
                return False
            self.seal()
            return True
        finally:
            os.close(fd)

    @property
    def drained(self) -> bool:
        return (self.path / DRAINED).exists()

    def mark_drained(self) -> None:
        write_durably(self.path / DRAINED, repr(time.time()).encode())

    def size(self) -> int:
        """Bytes its folder holds on this disk (a folder drained in place is not counted: it is not ours)."""
        total = 0
        for root, _, names in os.walk(self.path):
            for n in names:
                try:
                    total += os.lstat(os.path.join(root, n)).st_size
                except OSError:
                    pass
        return total

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def __repr__(self) -> str:
        return f"Entry({str(self.path)!r})"


def entry_name(url: str) -> str:
    """The folder of the checkpoint going to ``url``: readable, and unique per URL."""
    tail = url.rstrip("/").rsplit("/", 1)[-1] or "checkpoint"
    tail = "".join(c if c.isalnum() or c in "-_." else "_" for c in tail)[:64].lstrip(".") or "checkpoint"
    return f"{tail}-{xxhash.xxh3_64_hexdigest(url.rstrip('/').encode())}"


class StagingDir:
    """A node-local staging directory (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str], capacity: int | None = None) -> None:
        self.root = Path(root).expanduser().absolute()
        if capacity is not None and capacity <= 0:
            raise CheckpointError(f"staging capacity must be > 0 bytes, got {capacity}")
        self.capacity = capacity

    def entry(self, url: str) -> Entry:
        return Entry(self.root / entry_name(url))

    def entries(self) -> list[Entry]:
        """Every entry, oldest sealed first; entries still being written last."""
        if not self.root.is_dir():
            return []
        found = [Entry(p) for p in self.root.iterdir() if p.is_dir() and (p / SPEC).exists()]
        return sorted(found, key=lambda e: (e.sealed_at is None, e.sealed_at or 0.0, e.name))

    def pending(self) -> list[Entry]:
        """Sealed entries not drained yet, oldest first: the drain's queue."""
        return [e for e in self.entries() if e.sealed_at is not None and not e.drained]

    def room(self) -> int:
        """Bytes a save may still write here."""
        self.root.mkdir(parents=True, exist_ok=True)
        st = os.statvfs(self.root)
        free = st.f_bavail * st.f_frsize
        if self.capacity is None:
            return free
        used = sum(e.size() for e in self.entries())
        return max(0, min(free, self.capacity - used))

    def make_room(self, needed: int, *, keep: Entry | None = None, timeout: float = 600.0,
                  kick: Callable[[], None] | None = None) -> None:
        """Return once ``needed`` bytes fit, removing drained entries (oldest first) and waiting for the drain.

        Args:
            keep: the entry being written (never removed).
            timeout: seconds to wait for the drain to free room; 0 fails at once.
            kick: called once before waiting, to start a drain if none runs.

        Raises:
            StagingFull: the room did not come within ``timeout`` (or can never come: the save
                is larger than the capacity).
        """
        if self.capacity is not None and needed > self.capacity:
            raise StagingFull(f"{self.root}: a save of {needed} bytes is larger than the staging capacity "
                              f"({self.capacity} bytes)")
        deadline = time.monotonic() + timeout
        kicked = False
        while True:
            if self.room() >= needed:
                return
            removable = [e for e in self.entries() if e.drained and (keep is None or e.path != keep.path)]
            if removable:
                removable[0].remove()  # only checkpoints every store holds, verified
                continue
            if time.monotonic() >= deadline:
                waiting = len(self.pending())
                raise StagingFull(f"{self.root}: no room for a save of {needed} bytes ({self.room()} free) after "
                                  f"waiting {timeout:g}s for the drain ({waiting} checkpoint(s) still draining); "
                                  "nothing was removed that is not at every store")
            if kick is not None and not kicked:
                kick()
                kicked = True
            time.sleep(_POLL_S)  # another process frees the room: nothing here to wait on but the disk
