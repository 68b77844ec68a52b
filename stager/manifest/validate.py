"""Validation of untrusted manifests, vectorised so a million entries check fast.

A manifest comes from the origin, which we do not trust: every path must stay
inside the dataset root, sizes and counts must be plausible and consistent
with the block size. The first bad entry is reported by position and path.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

try:  # The compute kernels themselves: pyarrow.compute only wraps them, and building its
    # wrappers costs every command that loads a manifest 30 to 60 ms of start-up.
    from pyarrow._compute import CastOptions, MatchSubstringOptions, SetLookupOptions, call_function
except ImportError:  # pragma: no cover - a pyarrow that moved them
    from pyarrow.compute import CastOptions, MatchSubstringOptions, SetLookupOptions, call_function

from ..errors import ManifestError
from ..hashing import block_count
from ..paths import BAD_PATH_PATTERN, BAD_PATH_PROBLEM
from ..codecs import DECODED, NARROW_FORMS
from .model import CODECS, LAYOUTS, filled

MAX_SHARD_SIZE = 1 << 50  # 1 PiB: anything larger is a corrupt manifest, not a shard
MIN_BLOCK_SIZE = 4096
MAX_BLOCK_SIZE = 1 << 30
KNOWN_DTYPES = frozenset({"uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"})


def _first(mask: pa.ChunkedArray | pa.Array | np.ndarray) -> int | None:
    arr = np.asarray(mask.to_numpy(zero_copy_only=False) if hasattr(mask, "to_numpy") else mask, dtype=bool)
    hits = np.flatnonzero(arr)
    return int(hits[0]) if len(hits) else None


def validate_table(table: pa.Table, block_size: int, name: str) -> None:
    """Raise :class:`ManifestError` naming ``name`` and the first bad entry, if any."""
    if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
        raise ManifestError(f"{name}: block size {block_size} is outside {MIN_BLOCK_SIZE}..{MAX_BLOCK_SIZE}")
    paths = table.column("path")

    def bad(row: int, problem: str) -> ManifestError:
        return ManifestError(f"{name}: entry {row} ({paths[row].as_py()!r}): {problem}")

    for column in ("path", "size", "digest", "blocks"):
        row = _first(call_function("is_null", [table.column(column)]))
        if row is not None:
            raise ManifestError(f"{name}: entry {row}: {column} is missing")

    row = _first(call_function("match_substring_regex", [paths], MatchSubstringOptions(BAD_PATH_PATTERN)))
    if row is not None:
        raise bad(row, BAD_PATH_PROBLEM)

    if table.num_rows > 1:
        # Manifests are written sorted by path: strictly increasing means unique, checked in one pass.
        if call_function("any", [call_function("less_equal", [paths[1:], paths[:-1]])]).as_py():
            order = call_function("sort_indices", [paths])
            sorted_paths = call_function("take", [paths, order])
            dup = _first(call_function("equal", [sorted_paths[1:], sorted_paths[:-1]]))
            if dup is not None:
                raise bad(int(order[dup + 1].as_py()), "duplicate path")

    sizes = table.column("size").to_numpy()
    row = _first((sizes < 0) | (sizes > MAX_SHARD_SIZE))
    if row is not None:
        raise bad(row, f"size {int(sizes[row])} is negative or absurd")

    counts = call_function("list_value_length", [table.column("blocks")]).to_numpy(zero_copy_only=False)
    expected = -(-sizes // block_size)
    row = _first(counts != expected)
    if row is not None:
        raise bad(row, f"has {int(counts[row])} block digests, expected {block_count(int(sizes[row]), block_size)} "
                       f"for {int(sizes[row])} bytes in blocks of {block_size}")

    tokens = table.column("tokens")
    dtypes = table.column("dtype")
    if tokens.null_count < table.num_rows:
        tok = call_function("coalesce", [tokens, pa.scalar(0, tokens.type)]).to_numpy()
        row = _first(tok < 0)
        if row is not None:
            raise bad(row, f"token count {int(tok[row])} is negative")
        itemsize = np.maximum(_itemsizes(dtypes), 1)  # an unknown dtype is refused below; count it 1 byte
        if "raw_size" in table.schema.names:  # a compressed shard's tokens are in its decompressed form
            sizes = np.maximum(sizes, filled(table.column("raw_size"), -1).to_numpy())
        row = _first(tok * itemsize > sizes * 8 + 64)  # tokens cannot outnumber the bytes (parquet compresses, so slack)
        if row is not None:
            raise bad(row, f"token count {int(tok[row])} does not fit in {int(sizes[row])} bytes")
    if "layout" in table.schema.names:
        layouts = table.column("layout")
        known = call_function("is_in", [layouts], SetLookupOptions(pa.array(sorted(LAYOUTS))))
        row = _first(call_function("and", [call_function("invert", [known]), call_function("is_valid", [layouts])]))
        if row is not None:
            raise bad(row, f"unknown layout {layouts[row].as_py()!r}")
    if "codec" in table.schema.names:
        _check_codecs(table, bad)
    if dtypes.null_count < table.num_rows:
        known = call_function("is_in", [dtypes], SetLookupOptions(pa.array(sorted(KNOWN_DTYPES))))
        unknown = call_function("invert", [call_function("coalesce", [known, pa.scalar(True)])])
        row = _first(call_function("and", [unknown, call_function("is_valid", [dtypes])]))
        if row is not None:
            raise bad(row, f"unknown dtype {dtypes[row].as_py()!r}")


def _itemsizes(dtypes: pa.ChunkedArray) -> np.ndarray:
    """Each row's token size in bytes, 0 where its dtype is null or unknown (one look-up per distinct dtype)."""
    coded = call_function("dictionary_encode", [filled(dtypes, "").combine_chunks()])
    sizes_of = np.array([np.dtype(d).itemsize if d in KNOWN_DTYPES else 0 for d in coded.dictionary.to_pylist()],
                        dtype=np.int64)
    return sizes_of[coded.indices.to_numpy(zero_copy_only=False)]


def _check_codecs(table: pa.Table, bad) -> None:
    """A compressed shard names a known codec and carries its decompressed size and digest."""
    codecs = table.column("codec")
    if codecs.null_count == table.num_rows:
        return
    known = call_function("is_in", [codecs], SetLookupOptions(pa.array(sorted(CODECS))))
    row = _first(call_function("and", [call_function("invert", [known]), call_function("is_valid", [codecs])]))
    if row is not None:
        raise bad(row, f"unknown codec {codecs[row].as_py()!r}")
    compressed = call_function("is_valid", [codecs]).to_numpy(zero_copy_only=False)
    for name in ("raw_size", "raw_digest"):
        present = (call_function("is_valid", [table.column(name)]).to_numpy(zero_copy_only=False)
                   if name in table.schema.names else np.zeros(table.num_rows, bool))
        row = _first(compressed & ~present)
        if row is not None:
            raise bad(row, f"is compressed ({codecs[row].as_py()}) but has no {name}")
    raw = filled(table.column("raw_size"), 0).to_numpy()
    row = _first((raw < 0) | (raw > MAX_SHARD_SIZE))
    if row is not None:
        raise bad(row, f"raw_size {int(raw[row])} is negative or absurd")
    decoded = call_function("is_in", [codecs], SetLookupOptions(pa.array(sorted(DECODED))))
    decoded = filled(decoded, False).to_numpy(zero_copy_only=False)
    if decoded.any():  # a decoded form holds its tokens in the column's dtype or a narrower form
        tokens = filled(table.column("tokens"), -1).to_numpy()
        dtypes = table.column("dtype")
        width = _itemsizes(dtypes)
        fits = raw == tokens * width
        for form in NARROW_FORMS:
            fits |= (width > form.itemsize) & (raw == tokens * form.itemsize)
        row = _first(decoded & ((width == 0) | (tokens < 0) | ~fits))
        if row is not None:
            raise bad(row, f"raw_size {int(raw[row])} is not {int(tokens[row])} tokens of its dtype "
                           f"{dtypes[row].as_py()} (nor of a narrower form of it)")
