"""The source manifest of a replication: read from the source, or built on the fly and cached.

The manifest read from ``SRC/.stager/manifest.parquet`` is kept as its bytes:
they are what the destination gets at the end (the replica's manifest is a
copy of the source's, same digests), and their xxh3-64 is the run id that
every shard computes alike without talking to the others.

Without one, the source is indexed as ``stager index`` would (every file
hashed once) and the result kept in the state directory under a fingerprint
of the source listing (paths, sizes, mtimes), so a rerun after a kill does not
hash the source again unless it changed. Sharded runs need a manifest at the
source: N shards indexing on their own would each read everything.

An index made on the fly is ours, not the data owner's: when an object's
blocks keep failing against it (an older stager recorded a corrupted read,
say), that object is hashed again (:func:`reindex_object`), the copy goes on
by the new digests and the kept index is rewritten (:func:`keep_reindexed`).
A manifest found at the source stays the truth: failing there is right.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import xxhash

from ..errors import CorruptData, ManifestError, OriginError, ShardNotFound, first_error
from ..manifest import (
    MANIFEST_DIR,
    MANIFEST_PATH,
    LoadedManifest,
    Manifest,
    ShardEntry,
    decode_manifest,
    load_manifest_data,
    encode_manifest,
)
from ..manifest.build import IndexConfig, build_manifest, token_info
from ..manifest.object_hash import hash_object
from ..store import Store, UnsupportedOperation
from ..store.translate import relocated

#: Reads of a legacy manifest (no digest of its own) at most, until two of them agree.
MANIFEST_READS = 8


@dataclass(frozen=True, slots=True)
class SourceManifest:
    """The source's manifest, its encoded bytes and the run id derived from them."""

    manifest: Manifest
    data: bytes
    indexed: bool  # built on the fly: the source has no manifest
    kept: Path | None = None  # where an index built on the fly is kept (in the state directory)

    @property
    def run_id(self) -> str:
        return run_id_of(self.data)


def run_id_of(data: bytes) -> str:
    """The id of a replication of the dataset whose manifest is ``data`` (16 hex digits)."""
    return xxhash.xxh3_64_hexdigest(data)


async def read_source_manifest(store: Store) -> LoadedManifest | None:
    """The manifest of ``store`` with its bytes, verified; None if it has none.

    The manifest is what every byte is checked against. A sealed one checks
    itself: it is read until it matches its own digest, inside the store's
    retry loop. A legacy one carries no digest, so it is read until two reads
    agree, so that a body corrupted in transit is not taken for the dataset's truth.

    Raises:
        ManifestError: still corrupt after the retry budget, or no two reads of a legacy one agreed.
        OriginError: reading failed beyond the retry budget.
    """
    loaded = await load_manifest_data(store, missing_ok=True)
    if loaded is None or loaded.sealed:
        return loaded
    seen = {xxhash.xxh3_128_digest(loaded.data)}
    for _ in range(MANIFEST_READS - 1):
        loaded = await load_manifest_data(store, missing_ok=True)
        if loaded is None:
            return None
        digest = xxhash.xxh3_128_digest(loaded.data)
        if digest in seen:
            return loaded
        seen.add(digest)
    raise ManifestError(f"{store.url.rstrip('/')}/{MANIFEST_PATH}: {MANIFEST_READS} reads of this legacy manifest "
                        "(no digest of its own) gave different bytes; the origin is corrupting bodies or the "
                        "manifest is being rewritten")


async def read_manifest_bytes(store: Store) -> bytes | None:
    """The raw manifest of a destination, or None if it has none.

    Verified as :func:`read_source_manifest` does; one that never checks out is
    returned as read (the caller treats it as unreadable: it is replaced at the end).

    Raises:
        OriginError: reading failed beyond the retry budget.
    """
    try:
        loaded = await read_source_manifest(store)
    except ManifestError:
        try:
            return await store.read(MANIFEST_PATH)
        except ShardNotFound:
            return None
        except OriginError as exc:  # say which URL, and where it was asked
            raise relocated(exc, MANIFEST_PATH, f"{store.url.rstrip('/')}/{MANIFEST_PATH}", store.endpoint) from exc
    return None if loaded is None else loaded.data


async def source_manifest(
    src: Store,
    state_dir: Path,
    *,
    allow_index: bool = True,
    index: IndexConfig | None = None,
    on_listed: Callable[[int, int], None] | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> SourceManifest:
    """The manifest to replicate ``src`` by.

    Raises:
        ManifestError: the source has an invalid manifest, or none and ``allow_index`` is False,
            or none and it cannot be listed (plain HTTP).
        OriginError: reading or listing the source failed.
    """
    name = f"{src.url.rstrip('/')}/{MANIFEST_PATH}"
    loaded = await read_source_manifest(src)
    if loaded is not None:
        return SourceManifest(loaded.manifest, loaded.data, indexed=False)
    if not allow_index:
        raise ManifestError(f"{name}: no manifest; run `stager index {src.url}` first "
                            "(every shard must plan from the same manifest)")
    try:
        fingerprint = await listing_fingerprint(src)
    except UnsupportedOperation as exc:
        raise ManifestError(f"{name}: no manifest, and {src.url} cannot be listed to index it; "
                            "index the dataset where it can be listed") from exc
    cached = state_dir / f"index-{fingerprint}.parquet"
    data = await asyncio.to_thread(_read_if_present, cached)
    if data is not None:
        try:
            return SourceManifest(decode_manifest(data, str(cached)), data, indexed=True, kept=cached)
        except ManifestError:
            cached.unlink(missing_ok=True)  # damaged: index again
    try:
        manifest = await build_manifest(src, index or IndexConfig(), on_listed=on_listed, on_bytes=on_bytes)
    except BaseExceptionGroup as group:  # the indexer's task group: report its first error
        raise first_error(group) from None
    data = encode_manifest(manifest)
    await asyncio.to_thread(_keep_index, cached, data)
    return SourceManifest(manifest, data, indexed=True, kept=cached)


async def reindex_object(src: Store, path: str, index: IndexConfig) -> ShardEntry:
    """The manifest entry of ``src``'s object at ``path``, hashed again as :func:`build_manifest` would.

    For an index made on the fly (by this stager or an older one) whose digests of an object
    keep failing: the index is ours, not the data owner's, so it is what may be wrong.

    Raises:
        CorruptData: the object's reads do not agree, or changed while read.
        ShardNotFound: the object is gone.
        OriginError: reading failed beyond the retry budget.
    """
    info = await src.info(path)
    try:
        hashed = await hash_object(src, info, index.block_size, gate=asyncio.Semaphore(index.read_ahead),
                                   read_ahead=index.read_ahead, keep_tail=path.endswith(".parquet"))
        dtype, tokens = token_info(path, info.size, hashed.head, hashed.tail, index)
    except ManifestError as exc:  # it changed size while read: a per-object failure, not the run's
        raise CorruptData(str(exc)) from exc
    return ShardEntry(path, info.size, hashed.digest, hashed.blocks, dtype, tokens, info.mtime)


async def keep_reindexed(source: SourceManifest, fixed: dict[str, ShardEntry], name: str) -> SourceManifest:
    """``source`` with the entries of ``fixed`` replacing theirs, kept again in the state directory."""
    manifest = decode_manifest(source.data, name)
    entries = [fixed.get(entry.path, entry) for entry in manifest]
    manifest = Manifest.from_entries(entries, manifest.block_size)
    data = encode_manifest(manifest)
    if source.kept is not None:
        await asyncio.to_thread(_keep_index, source.kept, data)
    return SourceManifest(manifest, data, indexed=True, kept=source.kept)


def _read_if_present(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _keep_index(path: Path, data: bytes) -> None:
    """Save a manifest built on the fly in the state directory (atomically), replacing older ones."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob("index-*.parquet"):
        old.unlink(missing_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


async def listing_fingerprint(store: Store) -> str:
    """A digest of every object's path, size and mtime (order-independent), the manifest's folder left out."""
    total = 0
    count = 0
    async for page in store.scan():
        for obj in page:
            if obj.path.startswith(MANIFEST_DIR + "/"):
                continue
            total = (total + xxhash.xxh3_64_intdigest(f"{obj.path}\0{obj.size}\0{obj.mtime}".encode())) % (1 << 64)
            count += 1
    return f"{count:x}-{total:016x}"
