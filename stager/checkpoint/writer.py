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

Ranks on several nodes: each local plan says where its rank stages (host and
staging directory); the coordinator groups the ranks by it. When there is
more than one group, each is a part of the save (:mod:`.parts`): every rank
is told its part in the global plan, the last of a part's ranks to finish
writing seals that node's entry, and rank 0's part (sealed after
``.metadata``) names every file ``.metadata`` refers to, so that its drain
publishes the checkpoint only once every node's part is verified at a store.
One staging directory for every rank is the single-node save, unchanged.

Before any rank writes, it asks the staging directory for room for its bytes
(:meth:`~.staging.StagingDir.make_room`): checkpoints already at every store
make way, oldest first; otherwise the save waits up to ``wait_for_room``
seconds for the drain, then fails with :class:`~stager.errors.StagingFull`.
"""

from __future__ import annotations

import dataclasses
import io
import os
import socket
from collections.abc import Generator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem, _item_size, _StoragePrefix
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult

from ..config import DEFAULT_BLOCK_SIZE, SourceConfig
from ..errors import CheckpointError
from ..hashing import StreamHasher
from .manifest import METADATA_NAME, hash_file, write_record
from .manifest import FileRecord
from .parts import PartPlace, SavePart
from .staging import DrainSpec, Entry, StagingDir

#: Bytes a save may write beyond its tensors' own (torch.save's zip framing, .metadata, records).
_SLACK = 1 << 20
DRAIN_MODES = ("auto", "process", "none")


@dataclasses.dataclass(frozen=True)
class _RankPlace:
    """Where a rank stages its files (its local plan's storage data, read by the coordinator)."""

    host: str
    staging: str


@dataclasses.dataclass
class _PartPrefix(_StoragePrefix):
    """DCP's file prefix for a rank, and the part of a multi-node save its node holds."""

    save: SavePart | None = None


def _parts(plans: list[SavePlan], save_id: str) -> list[SavePart] | None:
    """Each rank's part when the ranks stage into more than one directory (several nodes); else None."""
    places = [plan.storage_data for plan in plans]
    if not all(isinstance(p, _RankPlace) for p in places):
        return None
    groups: dict[_RankPlace, list[int]] = {}
    for rank, place in enumerate(places):
        groups.setdefault(place, []).append(rank)
    if len(groups) < 2:
        return None
    layout = tuple(PartPlace(i, place.host, tuple(ranks)) for i, (place, ranks) in enumerate(groups.items()))
    index = {rank: part.part for part in layout for rank in part.ranks}
    return [SavePart(save_id, index[rank], layout) for rank in range(len(plans))]


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
        part_wait: for a save whose ranks are on several nodes, seconds rank 0's node's drain
            waits for the other nodes' parts at a store before it gives up (a later drain waits again).
        kwargs: passed to ``FileSystemWriter`` (``thread_count``, ``sync_files``...).

    Raises:
        StagingFull: (from ``save``) no room came in time.
        ConfigError, CheckpointError: bad arguments.
    """

    def __init__(self, url: str, *, staging_dir: str | os.PathLike[str], replicas: Sequence[str] = (),
                 storage_options: Mapping[str, Any] | None = None,
                 replica_options: Mapping[str, Mapping[str, Any]] | None = None,
                 staging_capacity: int | None = None, wait_for_room: float = 600.0, drain: str = "auto",
                 block_size: int = DEFAULT_BLOCK_SIZE, part_wait: float = 3600.0, **kwargs: Any) -> None:
        if drain not in DRAIN_MODES:
            raise CheckpointError(f"drain must be one of {', '.join(DRAIN_MODES)}, got {drain!r}")
        if wait_for_room < 0:
            raise CheckpointError(f"wait_for_room must be >= 0 seconds, got {wait_for_room}")
        if part_wait <= 0:
            raise CheckpointError(f"part_wait must be > 0 seconds, got {part_wait}")
        self.staging = StagingDir(staging_dir, staging_capacity)
        self.url = str(url).rstrip("/")
        super().__init__(self.staging.entry(self.url).path, **kwargs)
        self.fs = _HashingFileSystem(block_size)
        self.replicas = tuple(str(r).rstrip("/") for r in replicas)
        self.storage_options = dict(storage_options or {})
        self.replica_options = {str(k).rstrip("/"): dict(v) for k, v in (replica_options or {}).items()}
        self.wait_for_room = wait_for_room
        self.drain = drain
        self.part_wait = part_wait
        self.part: SavePart | None = None  # set by the global plan when the save's ranks are on several nodes

    # -- where this save goes ------------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(None)
        self.part = None
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
        return DrainSpec(tuple(targets), part=self.part, part_wait=self.part_wait)

    # -- the save --------------------------------------------------------------------------

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        entry = Entry(self.path)
        # Every rank looks (on several nodes, each has its own folder); no rank writes before all planned.
        if entry.path.exists():
            if entry.sealed_at is not None and not entry.drained:
                raise CheckpointError(f"{self.url}: an earlier save to this URL is still draining "
                                      f"(staged at {entry.path}); save under a new checkpoint id")
            entry.remove()  # drained already, or a save killed before it was sealed: its bytes count for nothing
        needed = sum(_item_size(item) for item in plan.items if item.tensor_data is not None) + _SLACK
        self.staging.make_room(needed, keep=entry, timeout=self.wait_for_room, kick=self._kick)
        plan = super().prepare_local_plan(plan)
        if plan.storage_data is None:  # the coordinator groups the ranks by where they stage
            plan = dataclasses.replace(plan, storage_data=_RankPlace(socket.gethostname(), str(self.staging.root)))
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        parts = _parts(plans, self.save_id)
        if parts is None:  # one node: DCP's own prefixes, nothing more
            plans = [dataclasses.replace(p, storage_data=None) if isinstance(p.storage_data, _RankPlace) else p
                     for p in plans]
            return super().prepare_global_plan(plans)
        return [dataclasses.replace(plan, storage_data=_PartPrefix(f"__{rank}_", parts[rank]))
                for rank, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner):  # type: ignore[override]
        self.part = getattr(plan.storage_data, "save", None)
        self.path.mkdir(parents=True, exist_ok=True)
        entry = Entry(self.path)
        entry.write_spec(self._spec())
        written = super().write_data(plan, planner)
        if self.part is not None and not self.part.publishes and self.rank is not None:
            if entry.finish_rank(self.rank, self.part.place.ranks):  # this node's last rank: its part is sealed
                self._kick()
        return written

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        super().finish(metadata, results)
        write_record(self.path, hash_file(self.path / METADATA_NAME, METADATA_NAME, self.fs.block_size))
        entry = Entry(self.path)
        if self.part is not None:  # the drain waits for every file .metadata names, from every node
            names = sorted({info.relative_path for info in metadata.storage_data.values()})
            self.part = dataclasses.replace(self.part, expected=tuple(names))
            entry.write_spec(self._spec())
        entry.seal()
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
