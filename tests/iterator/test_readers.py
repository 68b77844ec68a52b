import os

import numpy as np
import pytest

from stager.errors import ConfigError, CorruptData, ManifestError
from stager.iterator.readers import reader_for
from stager.write import encode_shard


@pytest.mark.parametrize("fmt", ["bin", "npy", "parquet"])
@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_reads_back_what_was_written(tmp_path, fmt, dtype):
    tokens = np.random.default_rng(0).integers(0, 60000, 10_000).astype(dtype)
    path = tmp_path / "blob"
    path.write_bytes(encode_shard(tokens, fmt))
    array = reader_for(f"a/shard.{fmt}").open(path, f"a/shard.{fmt}", dtype, len(tokens))
    assert array.dtype == np.dtype(dtype)
    assert np.array_equal(array, tokens)
    assert not array.flags.writeable


def test_flat_and_npy_are_memory_maps_not_copies(tmp_path):
    import mmap

    tokens = np.arange(1000, dtype=np.uint16)
    for fmt in ("bin", "npy"):
        path = tmp_path / fmt
        path.write_bytes(encode_shard(tokens, fmt))
        array = reader_for(f"x.{fmt}").open(path, f"x.{fmt}", "uint16", 1000)
        assert type(array) is np.ndarray  # not a memmap subclass: cheap to slice
        base = array
        while not isinstance(base, (mmap.mmap, memoryview)) and getattr(base, "base", None) is not None:
            base = base.base
        assert isinstance(base, (mmap.mmap, memoryview)), f"{fmt}: tokens are not backed by a memory map"


@pytest.mark.parametrize("fmt", ["bin", "npy", "parquet"])
def test_a_file_that_disagrees_with_the_manifest_is_refused(tmp_path, fmt):
    path = tmp_path / "blob"
    path.write_bytes(encode_shard(np.arange(100, dtype=np.uint16), fmt))
    with pytest.raises(CorruptData, match=f"shard.{fmt}: holds 100 tokens, the manifest says 99"):
        reader_for(f"shard.{fmt}").open(path, f"shard.{fmt}", "uint16", 99)


def test_wrong_dtype_and_garbage(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(encode_shard(np.arange(100, dtype=np.uint32), "npy"))
    with pytest.raises(CorruptData, match="uint32, the manifest says uint16"):
        reader_for("s.npy").open(path, "s.npy", "uint16", 100)
    path.write_bytes(b"not a npy file at all")
    with pytest.raises(CorruptData, match="s.npy"):
        reader_for("s.npy").open(path, "s.npy", "uint16", 10)
    with pytest.raises(CorruptData, match="s.parquet"):
        reader_for("s.parquet").open(path, "s.parquet", "uint16", 10)
    with pytest.raises(ManifestError, match="needs a dtype"):
        reader_for("s.bin").open(path, "s.bin", None, 10)


def test_unknown_format():
    with pytest.raises(ConfigError, match="no token reader"):
        reader_for("shard.txt")


def _pmd_mapped_kib(path) -> int:
    """FilePmdMapped of this process's maps of ``path``, from /proc/self/smaps."""
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("FilePmdMapped:"):
                total += int(line.split()[1])
    return total


def test_a_flat_shard_no_one_has_read_yet_is_mapped_in_huge_pages(tmp_path):
    # A blob the cache wrote with O_DIRECT is in no page cache: the reader's faults bring it in.
    # (A .npy reader reads the header first, and that read's readahead brings the file in.)
    fmt = "bin"
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as fh:
            if "[never]" in fh.read():
                pytest.skip("transparent huge pages are off on this machine")
    except OSError:
        pytest.skip("no transparent huge pages here")
    tokens = np.arange(8 << 20, dtype=np.uint16)  # 16 MiB
    path = tmp_path / f"shard.{fmt}"
    path.write_bytes(encode_shard(tokens, fmt))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache, as O_DIRECT leaves it
    finally:
        os.close(fd)
    array = reader_for(path.name).open(path, path.name, "uint16", len(tokens))
    assert int(array[::2048].astype(np.int64).sum()) == int(tokens[::2048].astype(np.int64).sum())
    if _pmd_mapped_kib(path) == 0:
        pytest.skip("this kernel's page cache gives this filesystem no huge pages")
    assert _pmd_mapped_kib(path) >= 2048


def test_the_manifests_layout_chooses_the_reader_whatever_the_suffix(tmp_path):
    from stager.iterator.readers import ArrowReader, FlatReader, ParquetReader

    assert isinstance(reader_for("corpus_text_document.bin", layout="megatron"), FlatReader)
    reader = reader_for("data-00000-of-00001.arrow", layout="arrow", column="input_ids")
    assert isinstance(reader, ArrowReader) and reader.column == "input_ids"
    assert reader_for("x.parquet", token_column="ids").column == "ids"
    assert isinstance(reader_for("x.parquet", layout="parquet", column="input_ids"), ParquetReader)
    assert reader_for("x.parquet", layout="parquet", column="input_ids", token_column="ids").column == "input_ids"
    with pytest.raises(ConfigError, match="no token reader for layout 'zip'"):
        reader_for("x.bin", layout="zip")


def test_an_arrow_stream_reads_as_its_token_column_and_refuses_a_truncated_one(tmp_path):
    import pyarrow as pa

    path = tmp_path / "blob"
    column = pa.array([[1, 2], [], None, [3, 4, 5]], pa.list_(pa.int32()))
    with pa.ipc.new_stream(str(path), pa.schema([("input_ids", column.type)])) as writer:
        writer.write_batch(pa.record_batch([column], names=["input_ids"]))
        writer.write_batch(pa.record_batch([column], names=["input_ids"]))
    array = reader_for("d.arrow", layout="arrow", column="input_ids").open(path, "d.arrow", "int32", 10)
    assert array.tolist() == [1, 2, 3, 4, 5] * 2 and array.dtype == np.int32
    path.write_bytes(path.read_bytes()[:60])
    with pytest.raises(CorruptData, match="d.arrow: "):
        reader_for("d.arrow", layout="arrow", column="input_ids").open(path, "d.arrow", "int32", 10)


def test_litdata_and_mds_readers_refuse_a_cache_file_that_is_not_what_the_manifest_says(tmp_path):
    from pathlib import Path

    fixtures = Path(__file__).resolve().parents[1] / "formats" / "fixtures"
    chunk = (fixtures / "litdata" / "data" / "chunk-0-0.bin").read_bytes()
    path = tmp_path / "blob"
    path.write_bytes(chunk)
    tokens = reader_for("chunk-0-0.bin", layout="litdata").open(path, "chunk-0-0.bin", "int32", 1194)
    assert tokens.dtype == np.int32 and not tokens.flags.writeable
    base = tokens
    while getattr(base, "base", None) is not None and not isinstance(base, memoryview):
        base = base.base
    assert isinstance(base, memoryview)  # a view of the map, not a copy
    with pytest.raises(CorruptData, match="chunk-0-0.bin: holds 1194 tokens, the manifest says 1000"):
        reader_for("chunk-0-0.bin", layout="litdata").open(path, "chunk-0-0.bin", "int32", 1000)
    path.write_bytes(b"\xff\xff\xff\x00" + chunk[4:])
    with pytest.raises(CorruptData, match="chunk-0-0.bin: its header says"):
        reader_for("chunk-0-0.bin", layout="litdata").open(path, "chunk-0-0.bin", "int32", 1194)

    shard = (fixtures / "mds" / "fixed" / "shard.00000.mds").read_bytes()
    path.write_bytes(shard)
    tokens = reader_for("shard.00000.mds", layout="mds", column="tokens").open(path, "s.mds", "uint16", 38 * 64)
    expected = np.load(fixtures / "mds" / "expected.npz")["fixed/shard.00000.mds"]
    assert np.array_equal(tokens, expected) and not tokens.flags.writeable
    path.write_bytes(shard[:len(shard) // 2])
    with pytest.raises(CorruptData, match="s.mds: not a readable MDS shard"):
        reader_for("shard.00000.mds", layout="mds", column="tokens").open(path, "s.mds", "uint16", 38 * 64)
