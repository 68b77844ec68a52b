"""The manifest's file format: Parquet with a versioned schema, sealed with its own digest.

The file carries ``stager.format_version`` and ``stager.block_size`` in its
schema metadata, and (from version 2) ``stager.manifest_digest``, the
xxh3-128 of the file's bytes (:mod:`.seal`), checked before anything is
parsed. A reader refuses a version it does not know, with a message that says
so, rather than guessing at a layout; version 1 (legacy, unsealed) manifests
still load, judged by the structural checks alone, but only when no trace of a
seal is found. Compression is zstd; the columns are the ones in
:mod:`stager.manifest.model`.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import ManifestError
from .model import FORMAT_VERSION, LEGACY_FORMAT_VERSION, SCHEMA, Manifest
from .seal import DIGEST_KEY, UNSEALED_VALUE, check_seal, seal
from .validate import CastOptions, call_function, validate_table

_VERSION_KEY = b"stager.format_version"
_BLOCK_KEY = b"stager.block_size"
_CREATOR_KEY = b"stager.created_by"


def encode_manifest(manifest: Manifest) -> bytes:
    """Serialise a manifest to sealed Parquet bytes (written atomically by the caller)."""
    from .. import __version__

    table = manifest.table.replace_schema_metadata(
        {
            _VERSION_KEY: str(FORMAT_VERSION).encode(),
            _BLOCK_KEY: str(manifest.block_size).encode(),
            _CREATOR_KEY: f"stager {__version__}".encode(),
            DIGEST_KEY: UNSEALED_VALUE,
        }
    )
    sink = io.BytesIO()
    # Digests are random: dictionary encoding them only costs time on both ends.
    pq.write_table(table, sink, compression="zstd", use_dictionary=["dtype"], row_group_size=1 << 20)
    return seal(sink.getvalue())


def decode_manifest(data: bytes | memoryview, name: str) -> Manifest:
    """Verify, parse and validate manifest bytes read from ``name``.

    Raises:
        ManifestError: a digest that does not match, not Parquet, unknown version, wrong
            schema, or any invalid entry.
    """
    return parse_manifest(data, name, sealed=check_seal(data, name))


def parse_manifest(data: bytes | memoryview, name: str, *, sealed: bool) -> Manifest:
    """Parse and validate manifest bytes whose seal :func:`~.seal.check_seal` judged already.

    Args:
        sealed: what ``check_seal`` returned: True for bytes that matched their digest,
            False for bytes without one (then only a legacy version is accepted).

    Raises:
        ManifestError: not Parquet, a version that does not go with ``sealed``, wrong
            schema, or any invalid entry.
    """
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        metadata = pf.schema_arrow.metadata or {}
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ManifestError(f"{name}: not a readable manifest (truncated or not Parquet): {exc}") from exc
    if _VERSION_KEY not in metadata:
        raise ManifestError(f"{name}: not a stager manifest (no format version)")
    try:
        version = int(metadata[_VERSION_KEY])
        block_size = int(metadata[_BLOCK_KEY])
    except (KeyError, ValueError) as exc:
        raise ManifestError(f"{name}: unreadable format version or block size") from exc
    if version == FORMAT_VERSION and not sealed:
        # The third marker: a sealed manifest whose two digest markers were both lost.
        raise ManifestError(f"{name}: a version {version} manifest without its digest (corrupt manifest)")
    if version == LEGACY_FORMAT_VERSION and sealed:
        raise ManifestError(f"{name}: a version {version} manifest with a digest: no stager writes that "
                            f"(only version {FORMAT_VERSION} manifests carry one)")
    if version not in (FORMAT_VERSION, LEGACY_FORMAT_VERSION):
        raise ManifestError(f"{name}: manifest format version {version} is not supported "
                            f"(this stager reads versions {LEGACY_FORMAT_VERSION} and {FORMAT_VERSION})")
    names = pf.schema_arrow.names
    missing = [f.name for f in SCHEMA if f.name not in names]
    if missing:
        raise ManifestError(f"{name}: manifest lacks column(s) {', '.join(missing)}")
    try:
        table = pf.read(columns=SCHEMA.names)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ManifestError(f"{name}: manifest is corrupt: {exc}") from exc
    try:
        table = _cast(table)
    except (pa.ArrowException, ValueError) as exc:
        raise ManifestError(f"{name}: manifest columns have the wrong types: {exc}") from exc
    try:
        for column in ("path", "dtype"):  # Parquet does not check UTF-8: a corrupt path must not get further
            table.column(column).validate(full=True)
    except (pa.ArrowException, ValueError) as exc:
        raise ManifestError(f"{name}: manifest is corrupt: {exc}") from exc
    validate_table(table, block_size, name)
    return Manifest(table, block_size)


def _cast(table: pa.Table) -> pa.Table:
    """``table`` with the manifest's column types (safe casts), untouched when it has them already.

    Through the compute kernel itself: ``Table.cast`` would import pyarrow.compute, a
    twentieth of a second of every command's start-up (see validate.py).
    """
    if table.schema.equals(SCHEMA, check_metadata=False):
        return table
    columns = [table.column(field.name) if table.schema.field(field.name).type == field.type
               else call_function("cast", [table.column(field.name)], CastOptions.safe(field.type))
               for field in SCHEMA]
    return pa.Table.from_arrays(columns, schema=SCHEMA)
