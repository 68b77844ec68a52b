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
        filled = call_function("coalesce", [dtypes, pa.scalar("uint8", dtypes.type)]).combine_chunks()
        coded = call_function("dictionary_encode", [filled])
        sizes_of = np.array([np.dtype(d).itemsize if d in KNOWN_DTYPES else 1 for d in coded.dictionary.to_pylist()])
        itemsize = sizes_of[coded.indices.to_numpy(zero_copy_only=False)]
        row = _first(tok * itemsize > sizes * 8 + 64)  # tokens cannot outnumber the bytes (parquet compresses, so slack)
        if row is not None:
            raise bad(row, f"token count {int(tok[row])} does not fit in {int(sizes[row])} bytes")
    if dtypes.null_count < table.num_rows:
        known = call_function("is_in", [dtypes], SetLookupOptions(pa.array(sorted(KNOWN_DTYPES))))
        unknown = call_function("invert", [call_function("coalesce", [known, pa.scalar(True)])])
        row = _first(call_function("and", [unknown, call_function("is_valid", [dtypes])]))
        if row is not None:
            raise bad(row, f"unknown dtype {dtypes[row].as_py()!r}")
