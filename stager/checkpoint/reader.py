"""CheckpointReader: a DCP storage reader that loads from the nearest complete, verified copy.

The manifest comes from the first store that has a good one: the local
staging copy (when ``staging_dir`` is given and its save is sealed, and is
the whole save: one node's part of a multi-node save is not), the
destination, then each replica (the manifest names them; more may be given).
Each file the load needs is then found, in that order: the staging copy if
its bytes hash to the record; else through stager's cache, in a session
(:func:`stager.session.open_session`, so the node daemon's engine when one
serves the cache), from the destination, then each replica. The cache only
ever hands out verified files. A file missing or damaged at one store is
read from the next; each such fall-back is logged and counted
(:attr:`CheckpointReader.fallbacks`). The tensors are then read from the
verified local files exactly as DCP's ``FileSystemReader`` reads them.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
from collections.abc import Generator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner

from ..config import CacheConfig, FetchConfig, RetryConfig, SourceConfig
from ..errors import CacheError, CheckpointIncomplete, ManifestError, OriginError, StagerError
from ..iterator.loop_thread import LoopThread
from ..store import open_store
from .manifest import MANIFEST_PATH, METADATA_NAME, CheckpointManifest, FileRecord, hash_file
from .staging import StagingDir

log = logging.getLogger(__name__)
#: Attempts at one store before its copy is passed over for the next store's.
_ATTEMPTS = 3


class _MappedFileSystem(FileSystem):
    """DCP's file system, with each checkpoint file name mapped to its verified local file."""

    def __init__(self) -> None:
        self.files: dict[str, Path] = {}

    def concat_path(self, path: str | os.PathLike, suffix: str) -> str | os.PathLike:
        return self.files.get(suffix) or Path(path) / suffix

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        with open(path, mode) as stream:
            yield stream


class CheckpointReader(FileSystemReader):
    """A ``torch.distributed.checkpoint`` storage reader (see the module docstring).

    Args:
        url: the checkpoint's destination URL (``dcp.load(..., checkpoint_id=URL)`` sets it too).
        cache_dir: stager's cache directory (default: the usual one).
        storage_options: the destination's options.
        replicas: replica URLs beyond those the manifest names.
        replica_options: per replica URL, its options; by default the destination's.
        staging_dir: the node's staging directory, to read a local copy first.
        session_mode: ``"auto"`` (the daemon when it serves ``cache_dir``), ``"daemon"`` or ``"embedded"``.
        fetch: an embedded engine's fetch settings; by default fewer retries than staging's,
            since a copy that keeps failing at one store is read from the next.

    Raises:
        CheckpointIncomplete: (from ``load``) a file is good at no store.
        ManifestError: no store has a good manifest.
    """

    def __init__(self, url: str, *, cache_dir: str | os.PathLike[str] | None = None,
                 storage_options: Mapping[str, Any] | None = None, replicas: Sequence[str] = (),
                 replica_options: Mapping[str, Mapping[str, Any]] | None = None,
                 staging_dir: str | os.PathLike[str] | None = None, session_mode: str = "auto",
                 fetch: FetchConfig | None = None) -> None:
        self.url = str(url).rstrip("/")
        super().__init__(self.url)
        self.fs = _MappedFileSystem()
        self.cache = CacheConfig(Path(cache_dir)) if cache_dir is not None else CacheConfig()
        self.storage_options = dict(storage_options or {})
        self.extra_replicas = tuple(str(r).rstrip("/") for r in replicas)
        self.replica_options = {str(k).rstrip("/"): dict(v) for k, v in (replica_options or {}).items()}
        self.staging = StagingDir(staging_dir) if staging_dir is not None else None
        self.session_mode = session_mode
        self.fetch = fetch or FetchConfig(retry=RetryConfig(attempts=_ATTEMPTS))
        self.manifest: CheckpointManifest | None = None
        self.fallbacks: list[tuple[str, str, str]] = []  # (file, store, why) for each copy passed over
        self.sources: dict[str, str] = {}  # file -> where it was read from ("staging" or a store URL)

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(None)
        if checkpoint_id:
            self.url = str(checkpoint_id).rstrip("/")
            self.path = self.url
            self.manifest = None
        self.fs.files.clear()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return bool(str(checkpoint_id))

    def _options(self, url: str) -> dict:
        return self.replica_options.get(url, self.storage_options)

    def stores(self) -> list[str]:
        """Where copies are, nearest first (after the staging copy): the destination, then each replica."""
        named = list(self.manifest.stores) if self.manifest is not None else []
        out = [self.url]
        for url in named + list(self.extra_replicas):
            if url.rstrip("/") not in out:
                out.append(url.rstrip("/"))
        return out

    # -- DCP's reader interface ------------------------------------------------------------

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        with LoopThread("stager-checkpoint") as loop:
            loop.run(self._find_manifest())
            loop.run(self._resolve([METADATA_NAME]))
        with open(self.fs.files[METADATA_NAME], "rb") as fh:
            metadata = pickle.load(fh)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner):  # type: ignore[override]
        needed = sorted({self.storage_data[item.storage_index].relative_path for item in plan.items})
        missing = [n for n in needed if n not in self.fs.files]
        if missing:
            with LoopThread("stager-checkpoint") as loop:
                if self.manifest is None:
                    loop.run(self._find_manifest())
                loop.run(self._resolve(missing))
        return super().read_data(plan, planner)

    # -- finding the copies ------------------------------------------------------------------

    async def _find_manifest(self) -> None:
        if self.manifest is not None:
            return
        problems = []
        if self.staging is not None:
            from .drain import manifest_for

            entry = self.staging.entry(self.url)
            if entry.sealed_at is not None:
                try:
                    if entry.spec().part is None:  # one node's part of a save is not the whole checkpoint
                        self.manifest = manifest_for(entry)
                        return
                except StagerError as exc:
                    problems.append(f"staging: {exc}")
        for url in [self.url, *self.extra_replicas]:
            try:
                async with open_store(SourceConfig(url, self._options(url))) as store:
                    data = await store.read(MANIFEST_PATH)
                self.manifest = CheckpointManifest.decode(data, f"{url}/{MANIFEST_PATH}")
                return
            except (OriginError, ManifestError) as exc:
                problems.append(str(exc))
                log.warning("checkpoint manifest at %s unusable: %s", url, exc)
        raise ManifestError(f"{self.url}: no complete copy of the checkpoint has a good manifest: "
                            + "; ".join(problems))

    async def _resolve(self, names: list[str]) -> None:
        """Find a verified local file for each of ``names``, nearest copy first."""
        assert self.manifest is not None
        wanted: dict[str, FileRecord] = {}
        for name in names:
            try:
                wanted[name] = self.manifest.file(name)
            except KeyError:
                raise CheckpointIncomplete(f"{self.url}: {name} is not in the checkpoint's manifest") from None
        if self.staging is not None:
            entry = self.staging.entry(self.url)
            for name, record in list(wanted.items()):
                local = entry.path / name
                if local.is_file() and hash_file(local, name, self.manifest.block_size) == record:
                    self.fs.files[name] = local
                    self.sources[name] = "staging"
                    del wanted[name]
        if not wanted:
            return
        from ..session import open_session

        for url in self.stores():
            if not wanted:
                break
            # A session per store: an engine shares one fetch per digest, and a fetch that keeps
            # failing at one store must not be joined by the read from the next.
            session = open_session(self.cache, self.fetch, mode=self.session_mode)  # type: ignore[arg-type]
            try:
                await self._from_store(session, url, wanted)
            finally:
                await session.close()
        if wanted:
            raise CheckpointIncomplete(f"{self.url}: no store holds a good copy of {', '.join(sorted(wanted))} "
                                       f"(tried {', '.join(self.stores())})")

    async def _from_store(self, session: Any, url: str, wanted: dict[str, FileRecord]) -> None:
        records = sorted(wanted.values(), key=lambda r: r.path)
        manifest = self.manifest.to_manifest(records)  # type: ignore[union-attr]
        try:
            dataset = await session.open_dataset(SourceConfig(url, self._options(url)), manifest)
            plan = await session.plan(dataset, list(range(len(records))), name=f"checkpoint {self.url}")
        except (OriginError, CacheError) as exc:
            for record in records:
                self._passed_over(record.path, url, exc)
            return
        try:
            for position, record in enumerate(records):
                try:
                    path = await plan.ready(position)
                except (OriginError, CacheError) as exc:
                    self._passed_over(record.path, url, exc)
                    continue
                self.fs.files[record.path] = Path(path)
                self.sources[record.path] = url
                del wanted[record.path]
        finally:
            await plan.close()

    def _passed_over(self, name: str, url: str, exc: BaseException) -> None:
        self.fallbacks.append((name, url, str(exc)))
        log.warning("checkpoint file %s: no good copy at %s (%s); trying the next store", name, url, exc)
