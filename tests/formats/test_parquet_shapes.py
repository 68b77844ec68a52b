"""Parquet token columns of every shape: list, large_list, fixed_size_list of any integer type."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stager.iterator.readers import reader_for
from .golden import assert_every_sample_once, epoch, index, refused

SEQ = 2048


def fixed_length_corpus(root, shards=3, rows=1100, seed=0):
    """fixed_size_list<uint16>[2048] in row groups of 1024 rows, BYTE_STREAM_SPLIT + zstd (as reported)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(shards):
        values = rng.integers(0, 65535, rows * SEQ, dtype=np.uint16)
        column = pa.FixedSizeListArray.from_arrays(pa.array(values), SEQ)
        pq.write_table(pa.table({"tokens": column, "id": np.arange(rows)}), root / f"part-{i:03d}.parquet",
                       row_group_size=1024, compression="zstd", use_dictionary=False,
                       column_encoding={"tokens": "BYTE_STREAM_SPLIT"})


def native_rows(root, column="tokens"):
    """Each row of every file as its own array: what a Parquet reader hands a training loop."""
    rows = []
    for path in sorted(root.glob("*.parquet")):
        for row in pq.read_table(path, columns=[column]).column(column).to_pylist():
            if row:
                rows.append(np.asarray(row, dtype=pq.read_schema(path).field(column).type.value_type.to_pandas_dtype()))
    return rows


def test_fixed_size_list_in_byte_stream_split_is_indexed_and_one_window_is_one_row(tmp_path, capsys):
    data = tmp_path / "data"
    fixed_length_corpus(data)
    manifest = index(data, capsys)
    assert list(manifest.tokens) == [1100 * SEQ] * 3
    assert set(manifest.dtypes) == {"uint16"} and set(manifest.layouts) == {"parquet"}
    assert_every_sample_once(epoch(data, tmp_path / "cache", SEQ), native_rows(data))


@pytest.mark.parametrize("kind", ["list", "large_list", "fixed_size_list"])
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"])
def test_every_list_shape_of_every_integer_type(tmp_path, capsys, kind, dtype):
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(1)
    width = 8
    for i in range(2):
        values = rng.integers(0, 100, 40 * width).astype(dtype)
        if kind == "fixed_size_list":
            column = pa.FixedSizeListArray.from_arrays(pa.array(values), width)
        else:
            offsets = np.arange(0, len(values) + 1, width)
            cls = pa.LargeListArray if kind == "large_list" else pa.ListArray
            column = cls.from_arrays(pa.array(offsets, pa.int64() if kind == "large_list" else pa.int32()),
                                     pa.array(values))
        pq.write_table(pa.table({"ids": column}), data / f"s{i}.parquet")
    manifest = index(data, capsys, "--token-column", "ids")
    assert list(manifest.tokens) == [40 * width] * 2 and set(manifest.dtypes) == {dtype}
    assert set(manifest.columns) == {"ids"}
    assert_every_sample_once(epoch(data, tmp_path / "cache", width), native_rows(data, "ids"))


def test_hub_export_with_input_ids_empty_and_null_rows_is_found_without_flags(tmp_path, capsys):
    # The Hub's Parquet exports name the column input_ids; empty and null documents hold no tokens.
    data = tmp_path / "data"
    data.mkdir()
    docs = [[1, 2, 3], [], [4, 5], None, [6, 7, 8, 9], [10]]
    column = pa.array(docs, pa.list_(pa.int32()))
    pq.write_table(pa.table({"text": [str(d) for d in docs], "input_ids": column}), data / "train-00000-of-00001.parquet")
    manifest = index(data, capsys)
    assert manifest.tokens[0] == 10 and manifest.columns == ["input_ids"]
    tokens = reader_for(manifest.paths[0], layout=manifest.layouts[0], column=manifest.columns[0]).open(
        data / manifest.paths[0], manifest.paths[0], "int32", 10)
    assert tokens.tolist() == list(range(1, 11))
    assert_every_sample_once(epoch(data, tmp_path / "cache", 2), [np.arange(i, i + 2, dtype=np.int32) for i in (1, 3, 5, 7, 9)])


def test_a_parquet_file_that_is_not_one_is_refused_with_one_line(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    fixed_length_corpus(data, shards=1, rows=10)
    good = (data / "part-000.parquet").read_bytes()
    (data / "part-000.parquet").write_bytes(good[: len(good) // 2])  # truncated: the footer is gone
    line = refused(data, capsys)
    assert "part-000.parquet: not a Parquet file" in line
