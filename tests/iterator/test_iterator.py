"""The token iterator against real origins: coverage, correctness, resume, small caches, faults."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from stager.cache import CacheTier
from stager.config import CacheConfig, FetchConfig, RetryConfig
from stager.errors import ConfigError, OriginError
from stager.iterator import TokenIterator
from stager.testing import FaultPlan
from tests.iterator.corpus import check_sample, expected_firsts, write_counting_corpus
from tests.iterator.resume_worker import make

FAST_RETRY = RetryConfig(attempts=12, backoff_base=0.005, backoff_max=0.05, deadline=60.0, request_timeout=15.0)
FETCH = FetchConfig(concurrency=8, durable=False, retry=FAST_RETRY)
LENGTHS = [int(x) for x in np.random.default_rng(1).integers(300, 900, 24)]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def corpus(tmp_path):
    return tmp_path / "data", write_counting_corpus(tmp_path / "data", LENGTHS)


def iterator(data, cache, **kwargs):
    settings = dict(seq_len=16, seed=5, shuffle_window=3, cache_dir=cache, capacity=1 << 30, fetch=FETCH, log_every=0)
    settings.update(kwargs)
    return TokenIterator(str(data), **settings)


def firsts_of(stream, n):
    return [check_sample(s, n) for s in stream]


@pytest.mark.parametrize("fmt", ["bin", "npy", "parquet"])
def test_an_epoch_is_every_sample_once_with_the_origins_tokens(tmp_path, fmt):
    manifest = write_counting_corpus(tmp_path / "data", LENGTHS, fmt=fmt)
    with iterator(tmp_path / "data", tmp_path / "cache") as it:
        first = firsts_of(it, 16)
        assert sorted(first) == sorted(expected_firsts(manifest, 16))
        assert len(first) == len(it) and it.epoch == 1
        second = firsts_of(it, 16)  # the next epoch: the same samples in another order
    assert sorted(second) == sorted(first) and second != first


def test_labels_batches_and_dtype(corpus, tmp_path):
    data, manifest = corpus
    with iterator(data, tmp_path / "cache", with_labels=True, batch_size=5, batches=True, dtype=np.int64) as it:
        batches = list(it)
    assert all(b.dtype == np.int64 and b.shape[1] == 17 for b in batches)
    assert [len(b) for b in batches[:-1]] == [5] * (len(batches) - 1) and 1 <= len(batches[-1]) <= 5
    firsts = [check_sample(row, 17) for b in batches for row in b]
    assert sorted(firsts) == sorted(expected_firsts(manifest, 16, with_labels=True))


def test_two_ranks_of_two_workers_cover_the_epoch_once(corpus, tmp_path):
    data, manifest = corpus
    seen = []
    for rank in range(2):
        for worker in range(2):
            with iterator(data, tmp_path / "cache", batch_size=3, rank=rank, world_size=2, worker=worker,
                          num_workers=2) as it:
                seen += firsts_of(it, 16)
    assert sorted(seen) == sorted(expected_firsts(manifest, 16))


def test_order_does_not_depend_on_the_world_size(corpus, tmp_path):
    data, _ = corpus
    with iterator(data, tmp_path / "cache", batch_size=2) as one:
        alone = firsts_of(one, 16)
    its = [iterator(data, tmp_path / "cache", batch_size=2, rank=r, world_size=3) for r in range(3)]
    try:
        streams = [firsts_of(it, 16) for it in its]
    finally:
        for it in its:
            it.close()
    # Step t of rank r is chunk 3t + r of the one global order.
    merged = []
    for t in range(max(len(s) for s in streams) // 2 + 1):
        for s in streams:
            merged += s[2 * t:2 * t + 2]
    assert merged == alone


def test_drop_last_gives_every_rank_whole_steps(corpus, tmp_path):
    data, _ = corpus
    counts = []
    for rank in range(3):
        with iterator(data, tmp_path / "cache", batch_size=4, batches=True, drop_last=True, rank=rank,
                      world_size=3) as it:
            counts.append([len(b) for b in it])
    assert counts[0] == counts[1] == counts[2] and set(counts[0]) == {4}


def test_resume_at_world_size_three_from_a_state_saved_at_two(corpus, tmp_path):
    data, manifest = corpus
    two = [iterator(data, tmp_path / "cache", batch_size=4, rank=r, world_size=2) for r in range(2)]
    seen = []
    for it in two:
        stream = iter(it)
        seen += [check_sample(next(stream), 16) for _ in range(4 * 7)]  # seven steps on each rank
    state = json.loads(json.dumps(two[0].state_dict()))  # what rank 0 checkpointed
    for it in two:
        it.close()
    for rank in range(3):
        with iterator(data, tmp_path / "cache", batch_size=4, rank=rank, world_size=3) as it:
            it.load_state_dict(state)
            seen += firsts_of(it, 16)
    assert sorted(seen) == sorted(expected_firsts(manifest, 16))


def test_resume_in_a_new_process_after_a_kill_equals_the_uninterrupted_stream(corpus, tmp_path):
    data, _ = corpus
    with make(str(data), str(tmp_path / "cache-whole")) as it:
        whole = [b[:, 0].tolist() for b in it]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first_out, second_out = tmp_path / "first.json", tmp_path / "second.json"
    cache = str(tmp_path / "cache")
    proc = subprocess.Popen([sys.executable, "-m", "tests.iterator.resume_worker", str(data), cache, "-",
                             str(first_out), "9"], env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while not first_out.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first_out.exists(), "the first process never checkpointed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    subprocess.run([sys.executable, "-m", "tests.iterator.resume_worker", str(data), cache, str(first_out),
                    str(second_out), "-1"], env=env, cwd=REPO, check=True, timeout=120)
    first = json.loads(first_out.read_text())["batches"]
    second = json.loads(second_out.read_text())["batches"]
    assert len(first) == 9
    assert first + second == whole


def test_a_state_saved_while_batches_are_made_ahead_resumes_exactly(corpus, tmp_path):
    data, _ = corpus
    with make(str(data), str(tmp_path / "cache")) as it:
        whole = [b[:, 0].tolist() for b in it]
    with make(str(data), str(tmp_path / "cache")) as it:
        first, queued = [], 0
        for batch in it:
            first.append(batch[:, 0].tolist())
            time.sleep(0.004)  # the step's compute: the helper makes the next batches meanwhile
            if len(first) == 12:
                queued = len(it._ahead._ready) if it._ahead is not None else 0
                state = it.state_dict()
                break
    assert queued > 0, "no batch was made ahead: the test would not test the state's accounting"
    with make(str(data), str(tmp_path / "cache")) as it:
        it.load_state_dict(state)
        second = [b[:, 0].tolist() for b in it]
    assert first + second == whole


def test_a_cache_a_quarter_of_the_dataset_streams_an_epoch(tmp_path):
    lengths = [16384] * 48  # 64 KiB shards, 3 MiB in all
    manifest = write_counting_corpus(tmp_path / "data", lengths, block_size=16384)
    capacity = manifest.total_bytes // 4
    with iterator(tmp_path / "data", tmp_path / "cache", seq_len=256, shuffle_window=2, capacity=capacity) as it:
        firsts = []
        peak = 0
        with CacheTier(CacheConfig(tmp_path / "cache", capacity=capacity)) as watcher:
            for i, sample in enumerate(it):
                firsts.append(check_sample(sample, 256))
                if i % 64 == 0:
                    peak = max(peak, watcher.usage().used)
        stats = it.stats()
    assert sorted(firsts) == sorted(expected_firsts(manifest, 256))
    assert peak <= capacity
    assert stats["shards_opened"] == 48 and stats["bytes_staged"] >= manifest.total_bytes


def test_stats_count_waits_hits_and_staged_bytes(corpus, tmp_path):
    data, manifest = corpus
    with iterator(data, tmp_path / "cache") as it:
        list(it)
        cold = it.stats()
        list(it)
        warm = it.stats()
    assert cold["shards_opened"] == 24 and cold["bytes_staged"] == manifest.total_bytes
    assert warm["cache_hits"] - cold["cache_hits"] == 24  # the second epoch finds everything staged
    assert warm["bytes_staged"] == cold["bytes_staged"]
    assert {"wait_seconds", "retries", "ready_steps"} <= set(warm)


def test_mid_epoch_stats_report_steps_ready_ahead(corpus, tmp_path):
    data, _ = corpus
    with iterator(data, tmp_path / "cache", batch_size=2) as it:
        list(it)  # everything staged
        stream = iter(it)
        next(stream)
        assert it.stats()["ready_steps"] >= (len(it) - 1) // 2 - 1


def test_a_state_of_another_dataset_or_seed_is_refused(corpus, tmp_path):
    data, _ = corpus
    with iterator(data, tmp_path / "cache") as it:
        state = it.state_dict()
    with iterator(data, tmp_path / "cache", seq_len=17) as other:
        with pytest.raises(ConfigError, match="another dataset"):
            other.load_state_dict(state)
    with iterator(data, tmp_path / "cache", seed=6) as other:
        with pytest.raises(ConfigError, match="seed"):
            other.load_state_dict(state)


def test_a_faulty_s3_origin_never_surfaces_an_error_or_a_wrong_token(s3_bucket, fault_proxy, tmp_path):
    manifest = write_counting_corpus(s3_bucket.path / "data", [4096 * 3 + 500] * 32, block_size=4096)
    plan = FaultPlan(slowdown_p=0.06, error500_p=0.06, reset_p=0.06, truncate_p=0.06, flip_p=0.06,
                     ignore_range_p=0.06, spike_p=0.05, spike_s=0.3, latency_s=0.002)
    proxy = fault_proxy(s3_bucket, plan, seed=4)
    with TokenIterator(f"{s3_bucket.url}/data", storage_options=s3_bucket.storage_options(proxy.url), seq_len=64,
                       seed=2, shuffle_window=4, cache_dir=tmp_path / "cache", capacity=1 << 30, fetch=FETCH,
                       log_every=0) as it:
        firsts = firsts_of(it, 64)
        stats = it.stats()
    assert sorted(firsts) == sorted(expected_firsts(manifest, 64))
    faults = proxy.faults
    for kind in ("slowdown", "error500", "reset", "truncate", "flip", "ignore_range", "spike"):
        assert faults.get(kind, 0) > 0, f"no {kind} fault was injected: {faults}"
    assert stats["retries"] > 0


def test_an_origin_down_beyond_the_retry_budget_is_an_error_naming_the_shard(s3_bucket, fault_proxy, tmp_path):
    manifest = write_counting_corpus(s3_bucket.path / "data", [2000] * 4, block_size=4096)
    proxy = fault_proxy(s3_bucket, FaultPlan())
    fetch = FetchConfig(concurrency=4, durable=False,
                        retry=RetryConfig(attempts=3, backoff_base=0.01, backoff_max=0.05, deadline=2.0,
                                          request_timeout=2.0))
    with TokenIterator(f"{s3_bucket.url}/data", storage_options=s3_bucket.storage_options(proxy.url), seq_len=64,
                       cache_dir=tmp_path / "cache", capacity=1 << 30, fetch=fetch, log_every=0) as it:
        proxy.set_down(True)
        with pytest.raises(OriginError) as caught:
            for _ in it:
                pass
    assert any(path in str(caught.value) for path in manifest.paths), str(caught.value)


def test_a_periodic_log_line_reports_the_stats(corpus, tmp_path, caplog):
    data, _ = corpus
    with caplog.at_level("INFO", logger="stager.iterator.iterator"):
        with iterator(data, tmp_path / "cache", log_every=1e-9) as it:
            list(it)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stager: waited")]
    assert lines and "bytes staged" in lines[-1] and "steps ready ahead" in lines[-1]


def _flip_byte(path: Path, offset: int) -> None:
    path.chmod(0o644)
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, offset)[0] ^ 0x01]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("fmt", ["bin", "npy", "parquet"])
def test_a_byte_flipped_in_a_staged_blob_on_disk_never_reaches_a_sample(tmp_path, fmt):
    manifest = write_counting_corpus(tmp_path / "data", LENGTHS, fmt=fmt)
    with iterator(tmp_path / "data", tmp_path / "cache") as it:  # stages every shard
        assert sorted(firsts_of(it, 16)) == sorted(expected_firsts(manifest, 16))
    victim = 5
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=1 << 30)) as cache:
        blob = cache.complete_path(manifest.digest(victim))
    origin = (tmp_path / "data" / manifest.paths[victim]).read_bytes()
    # Inside the shard's first sample's tokens (past the .npy header; anywhere in a parquet page).
    offset = len(origin) // 2 if fmt == "parquet" else len(origin) - 4 * int(manifest.tokens[victim]) + 4 * 3
    _flip_byte(blob, offset)
    assert blob.read_bytes() != origin

    with iterator(tmp_path / "data", tmp_path / "cache") as it:
        first = firsts_of(it, 16)  # every sample checked against the origin's counting tokens
        stats = it.stats()
    assert sorted(first) == sorted(expected_firsts(manifest, 16))
    assert stats["corrupt_blobs"] == 1 and stats["read_checks_failed"] == 1
    assert stats["read_checks_files"] + stats["read_checks_resident"] == len(manifest)  # each taken once
    assert blob.read_bytes() == origin  # dropped and fetched again


def test_verify_reads_off_trusts_the_disk(tmp_path):
    manifest = write_counting_corpus(tmp_path / "data", LENGTHS)
    with iterator(tmp_path / "data", tmp_path / "cache", verify_reads="off") as it:
        assert sorted(firsts_of(it, 16)) == sorted(expected_firsts(manifest, 16))
        assert it.stats()["read_checks_files"] == it.stats()["read_checks_resident"] == 0
    with pytest.raises(ConfigError, match="verify_reads"):
        iterator(tmp_path / "data", tmp_path / "cache", verify_reads="sometimes")


def test_rot_under_an_unchanged_mtime_is_caught_once_the_pages_come_from_the_disk(tmp_path):
    # Disk rot changes the bytes on the medium, not the file's metadata, and reaches a reader only
    # through a read from the disk: flip a byte, put the mtime back, drop the file's pages.
    manifest = write_counting_corpus(tmp_path / "data", LENGTHS)
    with iterator(tmp_path / "data", tmp_path / "cache") as it:
        assert sorted(firsts_of(it, 16)) == sorted(expected_firsts(manifest, 16))
    with iterator(tmp_path / "data", tmp_path / "cache") as it:  # warm: in the page cache, as committed
        firsts_of(it, 16)
        warm = it.stats()
    assert warm["read_checks_resident"] == len(manifest) and warm["read_checks_files"] == 0
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=1 << 30)) as cache:
        blob = cache.complete_path(manifest.digest(7))
    origin = (tmp_path / "data" / manifest.paths[7]).read_bytes()
    st = blob.stat()
    _flip_byte(blob, 4 * 2)
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    fd = os.open(blob, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    with iterator(tmp_path / "data", tmp_path / "cache") as it:
        first = firsts_of(it, 16)
        stats = it.stats()
    assert sorted(first) == sorted(expected_firsts(manifest, 16))
    assert stats["corrupt_blobs"] == 1 and stats["read_checks_failed"] == 1
    assert blob.read_bytes() == origin
