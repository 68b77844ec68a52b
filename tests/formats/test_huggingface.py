"""Hugging Face ``datasets`` folders written by ``save_to_disk``: Arrow IPC streams read in place."""

from __future__ import annotations

import json

import numpy as np
import pytest

from .golden import assert_every_sample_once, epoch, index, refused

SEQ = 128


@pytest.fixture(scope="module")
def datasets():
    import datasets

    datasets.disable_progress_bars()
    return datasets


def save(datasets, path, rows, *, shards=3, dtype="int32", fixed=False, **columns):
    feature = datasets.Sequence(datasets.Value(dtype), length=len(rows[0]) if fixed else -1)
    features = datasets.Features({"input_ids": feature, **{k: datasets.Value("string") for k in columns}})
    data = datasets.Dataset.from_dict({"input_ids": rows, **columns}, features=features)
    data.save_to_disk(str(path), num_shards=shards)


def native_rows(datasets, path, column="input_ids"):
    """Each row's tokens, as the native loader hands them to a training loop.

    Its NumPy formatter widens every integer to int64; the values are compared in the dtype
    the dataset stores (its features say which), which is what stager yields.
    """
    loaded = datasets.load_from_disk(str(path))
    stored = loaded.features[column].feature.dtype
    rows = [np.asarray(row[column]) for row in loaded.with_format("numpy")]
    assert all(np.array_equal(r.astype(stored).astype(r.dtype), r) for r in rows)  # the cast loses nothing
    return [r.astype(stored) for r in rows]


@pytest.mark.parametrize("fixed", [False, True], ids=["list", "fixed_size_list"])
def test_one_window_is_one_row_of_a_saved_dataset(tmp_path, capsys, datasets, fixed):
    data = tmp_path / "data"
    rng = np.random.default_rng(5)
    rows = [rng.integers(0, 1 << 17, SEQ).tolist() for _ in range(300)]
    save(datasets, data, rows, fixed=fixed, text=[f"doc {i}" for i in range(300)])
    manifest = index(data, capsys)  # input_ids is found without --token-column
    arrows = [i for i, p in enumerate(manifest.paths) if p.endswith(".arrow")]
    assert {"state.json", "dataset_info.json"} <= set(manifest.paths) and len(arrows) == 3
    assert {(manifest.layouts[i], manifest.columns[i], manifest.dtypes[i]) for i in arrows} == {("arrow", "input_ids", "int32")}
    assert sum(int(manifest.tokens[i]) for i in arrows) == 300 * SEQ
    assert_every_sample_once(epoch(data, tmp_path / "cache", SEQ), native_rows(datasets, data))


def test_documents_of_any_length_are_concatenated_and_another_column_can_be_named(tmp_path, capsys, datasets):
    data = tmp_path / "data"
    rng = np.random.default_rng(6)
    rows = [rng.integers(0, 60000, int(n)).tolist() for n in rng.integers(0, 50, 200)]
    save(datasets, data, rows, shards=2, dtype="uint16")
    manifest = index(data, capsys, "--token-column", "input_ids")
    ids = [i for i, p in enumerate(manifest.paths) if p.endswith(".arrow")]
    per_file = []
    loaded = datasets.load_from_disk(str(data))
    assert sum(int(manifest.tokens[i]) for i in ids) == sum(len(r) for r in rows)
    for i in ids:  # each .arrow file is its own token stream, rows in order
        table = datasets.Dataset.from_file(str(data / manifest.paths[i])).with_format("numpy")
        stream = np.concatenate([np.asarray(r["input_ids"], np.uint16) for r in table])
        per_file += [stream[j:j + 10] for j in range(0, len(stream) - 9, 10)]
    assert len(loaded) == 200
    assert_every_sample_once(epoch(data, tmp_path / "cache", 10), per_file)


def test_a_truncated_arrow_file_and_a_state_that_lists_a_missing_file_are_refused(tmp_path, capsys, datasets):
    data = tmp_path / "data"
    save(datasets, data, [[1, 2, 3, 4]] * 100, shards=2)
    shard = data / "data-00001-of-00002.arrow"
    good = shard.read_bytes()
    shard.write_bytes(good[:-100])
    line = refused(data, capsys)
    assert "data-00001-of-00002.arrow: " in line and "truncated" in line
    shard.unlink()
    assert "state.json: lists data-00001-of-00002.arrow, which is not there" in refused(data, capsys)
    state = json.loads((data / "state.json").read_text())
    state["_data_files"] = "nonsense"
    (data / "state.json").write_text(json.dumps(state))
    assert "state.json: not a Hugging Face dataset state" in refused(data, capsys)


@pytest.mark.parametrize("cut", [0, 5, 200])
def test_an_arrow_file_cut_before_its_schema_or_not_one_at_all_is_refused(tmp_path, capsys, datasets, cut):
    data = tmp_path / "data"
    save(datasets, data, [[1, 2, 3, 4]] * 50, shards=1)
    shard = data / "data-00000-of-00001.arrow"
    shard.write_bytes(shard.read_bytes()[:cut] if cut else b"PAR1 not an arrow stream at all, but named so")
    line = refused(data, capsys)
    assert "data-00000-of-00001.arrow: " in line and ("Arrow IPC stream" in line or "truncated" in line)


def test_an_arrow_ipc_file_and_unrelated_idx_and_index_json_files_are_no_obstacle(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.feather as feather

    data = tmp_path / "data"
    data.mkdir()
    column = pa.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]] * 10, pa.list_(pa.uint16()))
    feather.write_feather(pa.table({"input_ids": column}), str(data / "part.arrow"), compression="uncompressed")
    (data / "search.idx").write_bytes(b"TNTIDX\x00\x00 another tool's index")  # no Megatron magic, no .bin
    (data / "web").mkdir()
    (data / "web" / "index.json").write_text("<html>not json</html>")  # nothing of a layout beside it
    manifest = index(data, capsys)
    i = manifest.index_of("part.arrow")
    assert (manifest.layouts[i], manifest.tokens[i]) == ("arrow", 90)
    assert manifest.tokens[manifest.index_of("search.idx")] == -1
    native = [np.array([1, 2, 3], np.uint16), np.array([4, 5, 6], np.uint16), np.array([7, 8, 9], np.uint16)] * 10
    assert_every_sample_once(epoch(data, tmp_path / "cache", 3), native)
