"""Megatron-LM indexed datasets (.bin + .idx): read in place, refused when the pair disagrees."""

from __future__ import annotations

import struct
import warnings

import numpy as np
import pytest

from .golden import assert_every_sample_once, epoch, index, refused
from .megatron_format import read_dataset, write_dataset

DOC = 64  # tokens per document in the fixed-length datasets


def fixed_length(data, datasets=3, docs=50, dtype=np.uint16, seed=7):
    rng = np.random.default_rng(seed)
    documents = [[rng.integers(0, 50000, DOC).astype(dtype) for _ in range(docs)] for _ in range(datasets)]
    for i, docs_of_one in enumerate(documents):
        write_dataset(data / f"corpus_{i}_text_document", docs_of_one, dtype)
    return documents


@pytest.mark.slow
def test_the_real_builder_writes_what_these_helpers_write_and_stager_reads_it(tmp_path, capsys):
    """Golden: megatron-core's IndexedDatasetBuilder writes, its IndexedDataset reads, stager agrees."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its import warns about optional fused kernels
        import torch
        from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    data = tmp_path / "data"
    documents = fixed_length(tmp_path / "ours")
    data.mkdir()
    for i, docs in enumerate(documents):
        prefix = data / f"corpus_{i}_text_document"
        builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
        for doc in docs:
            builder.add_document(torch.from_numpy(doc.astype(np.int64)), [len(doc)])
        builder.finalize(f"{prefix}.idx")
        for suffix in (".bin", ".idx"):
            assert (tmp_path / "ours" / f"corpus_{i}_text_document{suffix}").read_bytes() == \
                   (data / f"corpus_{i}_text_document{suffix}").read_bytes()
    index(data, capsys)
    native = []
    for i in range(len(documents)):
        dataset = IndexedDataset(str(data / f"corpus_{i}_text_document"))
        # Copies: the dataset unmaps its .bin when it is collected, and views of it would dangle.
        native += [np.array(dataset[j]) for j in range(len(dataset))]
        del dataset
    assert_every_sample_once(epoch(data, tmp_path / "cache", DOC), native)


def test_one_window_is_one_megatron_sequence(tmp_path, capsys):
    data = tmp_path / "data"
    fixed_length(data)
    manifest = index(data, capsys)  # no --dtype needed: the .idx says uint16
    bins = [p for p in manifest.paths if p.endswith(".bin")]
    assert len(manifest) == 6 and len(bins) == 3
    for path in bins:
        i = manifest.index_of(path)
        assert (manifest.layouts[i], manifest.dtypes[i], int(manifest.tokens[i])) == ("megatron", "uint16", 50 * DOC)
    idx = manifest.index_of(bins[0][:-4] + ".idx")
    assert manifest.tokens[idx] == -1  # the index is a shard (the mount shows it) but holds no samples
    expected = [s for p in sorted(data.glob("*.bin")) for s in read_dataset(p.with_suffix(""))]
    stager = epoch(data, tmp_path / "cache", DOC)
    assert_every_sample_once(stager, expected)
    assert_every_sample_once(epoch(data, tmp_path / "cache", DOC, epoch_number=1), expected)


def test_int32_documents_of_any_length_concatenate_as_flat_shards_do(tmp_path, capsys):
    data = tmp_path / "data"
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 1 << 20, int(n)).astype(np.int32) for n in rng.integers(1, 300, 40)]
    write_dataset(data / "ds", docs, np.int32)
    manifest = index(data, capsys, "--dtype", "uint16")  # the .idx's dtype wins over --dtype for its .bin
    assert manifest.dtypes[manifest.index_of("ds.bin")] == "int32"
    stream = np.concatenate(read_dataset(data / "ds"))
    seq = 37
    windows = [stream[i:i + seq] for i in range(0, len(stream) - seq + 1, seq)]
    assert_every_sample_once(epoch(data, tmp_path / "cache", seq), windows)


def test_a_truncated_bin_is_refused_naming_it(tmp_path, capsys):
    data = tmp_path / "data"
    fixed_length(data, datasets=1)
    path = data / "corpus_0_text_document.bin"
    path.write_bytes(path.read_bytes()[:-2 * 10])
    line = refused(data, capsys)
    assert "corpus_0_text_document.bin: 6380 bytes, but" in line and "corpus_0_text_document.idx indexes 6400" in line


def test_an_index_that_disagrees_with_its_data_is_refused_naming_it(tmp_path, capsys):
    data = tmp_path / "data"
    fixed_length(data, datasets=1)
    idx = data / "corpus_0_text_document.idx"
    good = idx.read_bytes()
    header = 9 + 8 + 1 + 8 + 8
    bad = bytearray(good)
    struct.pack_into("<i", bad, header + 4 * 5, DOC + 1)  # sequence 5 one token longer: pointers disagree
    idx.write_bytes(bytes(bad))
    assert "corpus_0_text_document.idx: sequence 6 starts at byte" in refused(data, capsys)
    idx.write_bytes(good[:-8])  # truncated index
    line = refused(data, capsys)
    assert "corpus_0_text_document.idx: " in line and "truncated" in line
    bad = bytearray(good)
    bad[17] = 6  # float64 is no token type
    idx.write_bytes(bytes(bad))
    assert "corpus_0_text_document.idx: dtype code 6 is not an integer token type" in refused(data, capsys)
    idx.unlink()  # a .bin whose .idx is gone, beside other Megatron datasets
    fixed_length(data / "more", datasets=1)
    assert "corpus_0_text_document.bin: no " in refused(data, capsys)
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "tokens.bin").write_bytes(b"\0\0" * 10)
    assert "--format megatron, but there is no .idx file" in refused(flat, capsys, "--format", "megatron")
