"""The manifest: a dataset's single source of truth.

Every shard's relative path, size, whole-file xxh3-128 digest, per-block xxh3-64
digests and, for token shards, dtype and token count, in one Parquet file
stored beside the data at ``<source>/.stager/manifest.parquet``, so the source
URL alone finds it. The manifest is untrusted input, and is verified like a
shard: the file carries the xxh3-128 of its own bytes (:mod:`.seal`), checked
before parsing, inside the store's retry loop, so a body corrupted or cut in
transit is fetched again rather than taken for the truth (:mod:`.load`). Then
loading validates every entry (:mod:`.validate`) and refuses unknown format
versions (:mod:`.parquet`). It is written atomically, so a reader sees the
previous manifest or the new one, never half of one. Datasets another loader
wrote (MosaicML MDS, LitData, Hugging Face Arrow, Megatron, Parquet of any
token column shape) are indexed in place by :mod:`.layouts`, which records in
two optional columns (``layout``, ``column``) how the iterator reads each
token shard, and for a compressed one (MDS ``zip_data``, LitData ``.zstd.bin``)
three more (``codec``, ``raw_size``, ``raw_digest``) that describe the
decompressed form the cache makes of it and checks.
"""

from __future__ import annotations

from ..errors import ManifestError
from .load import LoadedManifest, load_manifest, load_manifest_data
from .model import FORMAT_VERSION, LEGACY_FORMAT_VERSION, SCHEMA, Manifest, ShardEntry
from .parquet import decode_manifest, encode_manifest
from .paths import MANIFEST_DIR, MANIFEST_PATH


async def save_manifest(store, manifest: Manifest) -> None:
    """Write ``manifest`` beside the data of ``store``, atomically."""
    await store.write(MANIFEST_PATH, encode_manifest(manifest))


def read_manifest_file(path: str) -> Manifest:
    """Load and validate a manifest from a local Parquet file."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read manifest: {exc.strerror}") from exc
    return decode_manifest(data, path)


__all__ = [
    "FORMAT_VERSION",
    "LEGACY_FORMAT_VERSION",
    "LoadedManifest",
    "MANIFEST_DIR",
    "MANIFEST_PATH",
    "Manifest",
    "ManifestError",
    "SCHEMA",
    "ShardEntry",
    "decode_manifest",
    "encode_manifest",
    "load_manifest",
    "load_manifest_data",
    "read_manifest_file",
    "save_manifest",
]
