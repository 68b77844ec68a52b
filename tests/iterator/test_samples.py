import pytest

from stager.errors import ConfigError
from stager.iterator.samples import SampleIndex, SampleSpec
from stager.manifest import Manifest, ShardEntry


def manifest(tokens):
    # A non-token entry is no .bin file: a .bin without tokens is refused (see the last test).
    entries = [ShardEntry(f"s{i:03d}.bin" if t >= 0 else f"s{i:03d}.txt", max(t, 0) * 2, f"{i:032x}", (1,) if t > 0 else (),
                          "uint16" if t >= 0 else None, t if t >= 0 else None) for i, t in enumerate(tokens)]
    return Manifest.from_entries(entries, block_size=1 << 20)


def test_counts_windows_and_skips_short_and_non_token_shards():
    m = manifest([10, 9, 25, -1, 3])
    index = SampleIndex(m, SampleSpec(5))
    assert index.counts.tolist() == [2, 1, 5, 0, 0]
    assert index.shards.tolist() == [0, 1, 2]
    assert len(index) == 8


def test_labels_take_one_more_token_with_the_same_stride():
    m = manifest([10, 11, 6])
    index = SampleIndex(m, SampleSpec(5, with_labels=True))
    assert SampleSpec(5, True).sample_len == 6
    assert index.counts.tolist() == [1, 2, 1]  # 11 tokens: windows at 0 and 5, each 6 long


def test_no_samples_is_a_clear_error():
    with pytest.raises(ConfigError, match="no samples of 100 tokens"):
        SampleIndex(manifest([10, 20]), SampleSpec(100))


def test_bad_seq_len():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError):
            SampleSpec(bad)


def test_fingerprint_follows_data_and_spec():
    m = manifest([100, 200])
    a = SampleIndex(m, SampleSpec(10)).fingerprint
    assert a == SampleIndex(m, SampleSpec(10)).fingerprint
    assert a != SampleIndex(m, SampleSpec(11)).fingerprint
    assert a != SampleIndex(m, SampleSpec(10, True)).fingerprint
    assert a != SampleIndex(manifest([100, 210]), SampleSpec(10)).fingerprint


def test_bin_files_that_are_not_token_shards_are_refused_by_name():
    entries = [ShardEntry("a.bin", 20, f"{1:032x}", (1,), "uint16", 10),
               ShardEntry("weights.bin", 21, f"{2:032x}", (1,), None, None),
               ShardEntry("notes.txt", 5, f"{3:032x}", (1,), None, None)]
    m = Manifest.from_entries(entries, block_size=1 << 20)
    with pytest.raises(ConfigError, match=r"weights\.bin.*not a token shard"):
        SampleIndex(m, SampleSpec(5), "ds")
