"""A dataset as the engine sees it: a store, its manifest, and blob references.

:class:`BlobRef` carries what fetching one blob needs (digest, size, block
digests, path); refs are made on demand from the manifest's columns, so a
million-shard dataset costs no million objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import FetchConfig, SourceConfig
from ..manifest import Manifest, load_manifest
from ..store import OriginStats, Store, StoreOptions, open_store


@dataclass(frozen=True, slots=True)
class BlobRef:
    """One blob to fetch: where it is at the origin and what its bytes must hash to.

    ``blocks`` are the xxh3-64 digests of its blocks of ``block_size`` bytes
    (the last may be shorter); ``dataset`` is where it comes from (not compared).
    """

    digest: str
    size: int
    block_size: int
    blocks: tuple[int, ...]
    path: str
    dataset: "Dataset" = field(compare=False, repr=False)


class Dataset:
    """A source opened for fetching: its store and validated manifest."""

    def __init__(self, source: SourceConfig, store: Store, manifest: Manifest) -> None:
        self.source = source
        self.store = store
        self.manifest = manifest

    @property
    def name(self) -> str:
        return self.store.url

    @classmethod
    async def open(cls, source: SourceConfig, fetch: FetchConfig, stats: OriginStats | None = None,
                   manifest: Manifest | None = None) -> "Dataset":
        """Open the store of ``source`` and load (or take) its manifest.

        Raises:
            ManifestError: no manifest, or an invalid one.
            OriginError: the origin cannot be read.
        """
        store = open_store(source, StoreOptions(retry=fetch.retry, bandwidth=fetch.bandwidth, stats=stats,
                                                concurrency=fetch.concurrency))
        try:
            if manifest is None:
                manifest = await load_manifest(store)
        except BaseException:
            await store.close()
            raise
        return cls(source, store, manifest)

    def ref(self, index: int) -> BlobRef:
        m = self.manifest
        return BlobRef(m.digest(index), int(m.sizes[index]), m.block_size, tuple(m.block_digests(index)),
                       m.paths[index], self)

    async def close(self) -> None:
        await self.store.close()
