"""A consumer's own side of opening a dataset: its source made absolute, its manifest loaded and validated here.

A consumer of the daemon needs the manifest too (it is small), to know its
shards; only the source travels to the daemon, which loads its own copy, and
the fallback engine is handed this one.
"""

from __future__ import annotations

import os

from ..config import FetchConfig, SourceConfig
from ..manifest import Manifest, load_manifest
from ..store import open_store, split_protocol


def absolute_source(source: SourceConfig) -> SourceConfig:
    """A local relative path made absolute: the daemon's working directory is not ours."""
    protocol, path = split_protocol(source.url)
    if (protocol or "file").lower() in ("file", "local") and not os.path.isabs(path):
        url = f"{protocol}://{os.path.abspath(path)}" if protocol else os.path.abspath(path)
        return SourceConfig(url, source.storage_options)
    return source


async def load_own_manifest(source: SourceConfig, fetch: FetchConfig) -> Manifest:
    """The dataset's manifest, loaded and validated in this process.

    Raises:
        ManifestError: no valid manifest at the source.
        OriginError: the origin cannot be read.
    """
    store = open_store(source, retry=fetch.retry, concurrency=2)
    try:
        return await load_manifest(store)
    finally:
        await store.close()
