"""What every golden format test does: index a layout written by its own writer, read it through stager.

``stager index`` runs as the CLI (in this process), the iterator reads from a
real cache through an embedded engine, and the samples are compared, as
bytes, with what the format's native reader returns: per epoch every native
sample exactly once, bit for bit.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterable

import numpy as np

from stager.config import FetchConfig, RetryConfig
from stager.iterator import TokenIterator
from stager.manifest import MANIFEST_PATH, read_manifest_file
from tests.cli.runner import run_here

FETCH = FetchConfig(concurrency=4, durable=False,
                    retry=RetryConfig(attempts=4, backoff_base=0.005, backoff_max=0.05, deadline=20.0,
                                      request_timeout=10.0))


def index(data: Path, capsys, *args: str):
    """``stager index DATA ARGS`` must succeed; returns the manifest it wrote."""
    result = run_here(["index", str(data), "--block-size", "64KiB", *args], capsys)
    assert result.returncode == 0, result.stderr
    manifest = read_manifest_file(str(data / MANIFEST_PATH))
    layouts = sorted({layout for layout in manifest.layouts if layout})
    summary = f"{int((manifest.tokens >= 0).sum())} token shards" + (f" ({', '.join(layouts)})" if layouts else "")
    assert summary in result.stdout, result.stdout  # the user sees what was recognised
    return manifest


def epoch(data: Path, cache: Path, seq_len: int, *, epoch_number: int = 0, **kwargs) -> list[np.ndarray]:
    """One whole epoch of ``seq_len``-token samples of ``data`` through stager."""
    settings = dict(seq_len=seq_len, seed=3, shuffle_window=2, cache_dir=cache, capacity=1 << 30, fetch=FETCH,
                    log_every=0, session="embedded", epoch=epoch_number)
    settings.update(kwargs)
    with TokenIterator(str(data), **settings) as it:
        samples = [np.array(s) for s in it]
        assert it.epoch == epoch_number + 1
    return samples


def assert_decompressed_once_then_mapped(data: Path, cache: Path, seq_len: int, manifest, native: list[np.ndarray],
                                         forms: int) -> None:
    """A cold epoch makes each compressed shard's decompressed form once into the cache (``forms`` of them, each
    a complete blob of the manifest's ``raw_size``); a warm epoch reads the same files without writing them."""
    from stager.cache import BlobState, CacheTier
    from stager.config import CacheConfig

    assert_every_sample_once(epoch(data, cache, seq_len), native)
    made = [cache / "blobs" / d[:2] / d for i in range(len(manifest)) if (d := manifest.raw_digest(i))]
    assert len(made) == forms and all(p.exists() for p in made)
    stamps = [p.stat().st_mtime_ns for p in made]
    with CacheTier(CacheConfig(directory=cache, capacity=1 << 30), reconcile=False) as tier:
        for i in range(len(manifest)):
            if manifest.raw_digest(i):
                record = tier.record(manifest.raw_digest(i))
                assert record is not None and record.state is BlobState.COMPLETE
                assert record.size == int(manifest.raw_sizes[i])
    assert_every_sample_once(epoch(data, cache, seq_len, epoch_number=1), native)  # warm: the same files, mapped
    assert [p.stat().st_mtime_ns for p in made] == stamps


def assert_a_changed_decompressed_form_is_made_again(data: Path, cache: Path, seq_len: int, manifest,
                                                    native: list[np.ndarray], shard: str) -> None:
    """One flipped token byte in ``shard``'s decompressed form on the cache disk (past its header): a new
    iterator's check drops it and makes it again, and no epoch serves the bad byte."""
    assert_every_sample_once(epoch(data, cache, seq_len), native)
    digest = manifest.raw_digest(manifest.index_of(shard))
    victim = cache / "blobs" / digest[:2] / digest
    good = victim.read_bytes()
    victim.chmod(0o644)
    with open(victim, "r+b") as fh:
        fh.seek(len(good) - 3)
        fh.write(bytes([good[-3] ^ 0x01]))
    assert_every_sample_once(epoch(data, cache, seq_len, epoch_number=1), native)  # a new iterator's checks
    assert victim.read_bytes() == good


def as_multiset(samples: Iterable[np.ndarray]) -> Counter:
    """Samples as a multiset of (dtype, bytes): equal means the same samples, bit for bit, as often."""
    return Counter((np.asarray(s).dtype.name, np.asarray(s).tobytes()) for s in samples)


def assert_every_sample_once(stager: list[np.ndarray], native: list[np.ndarray]) -> None:
    """stager's epoch holds exactly the native samples, each once, identical to the last bit."""
    assert len(stager) == len(native)
    assert as_multiset(stager) == as_multiset(native)


def refused(data: Path, capsys, *args: str) -> str:
    """``stager index DATA ARGS`` must fail with one error line and no traceback; returns that line."""
    result = run_here(["index", str(data), "--block-size", "64KiB", *args], capsys)
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("stager: error: ")]
    assert len(errors) == 1, result.stderr
    assert not (data / MANIFEST_PATH).exists()
    return errors[0]
