"""A cold start's first batch from verified blocks: the striped first window, against a slow S3 origin
behind the fault proxy (bytes counted at the proxy, never wall time)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from stager.iterator import EpochOrder
from stager.testing import FaultPlan
from tests.iterator.corpus import check_sample, expected_firsts, write_counting_corpus
from tests.iterator.stripe_worker import BLOCK, SETTINGS, make

SEQ = SETTINGS["seq_len"]
# 8 shards of 256 blocks each (uint32 tokens): a window of 4 is 16 MiB, one block of each shard 64 KiB.
LENGTHS = [256 * BLOCK // 4 + 300 * i for i in range(8)]
REPO = Path(__file__).resolve().parents[2]
SLOW = 200_000  # bytes/s through the proxy while the first batch is made


def slow_corpus(s3_bucket, fault_proxy, **plan):
    manifest = write_counting_corpus(s3_bucket.path / "data", LENGTHS, block_size=BLOCK)
    proxy = fault_proxy(s3_bucket, FaultPlan(latency_s=0.002, bandwidth_bps=SLOW, **plan), seed=3)
    return manifest, proxy, f"{s3_bucket.url}/data", s3_bucket.storage_options(proxy.url)


def rows_of(batches) -> list[int]:
    return [check_sample(row, SEQ) for batch in batches for row in np.asarray(batch)]


@pytest.mark.parametrize("make_ahead", [0, 4])
def test_a_cold_first_batch_fetches_a_small_part_of_its_window_and_the_epoch_is_exact(
        s3_bucket, fault_proxy, tmp_path, make_ahead):
    manifest, proxy, url, options = slow_corpus(s3_bucket, fault_proxy)
    with make(url, options, str(tmp_path / "cache"), make_ahead=make_ahead) as it:
        order = EpochOrder(it.index, it.order_spec, 0)
        window_bytes = int(manifest.sizes[order.window_shards(0)].sum())
        before = proxy.bytes_forwarded  # the manifest is in already
        stream = iter(it)
        first = next(stream)
        fetched = proxy.bytes_forwarded - before
        served = it.stats()["blocks_served"]
        proxy.update(bandwidth_bps=None)  # the rest of the epoch at loopback speed
        rest = list(stream)
    assert fetched < window_bytes / 8, f"{fetched:,} bytes fetched for the first batch, the window is {window_bytes:,}"
    assert served > 0
    firsts = rows_of([first, *rest])
    assert sorted(firsts) == sorted(expected_firsts(manifest, SEQ))  # every sample once, bit-identical


def test_the_first_window_is_read_block_by_block_and_later_windows_are_shuffled_whole(tmp_path):
    manifest = write_counting_corpus(tmp_path / "data", LENGTHS, block_size=BLOCK)
    with make(str(tmp_path / "data"), {}, str(tmp_path / "cache")) as it:
        index, spec = it.index, it.order_spec
    order = EpochOrder(index, spec, 2)
    again = EpochOrder(index, spec, 2)
    found = order.lookup(np.arange(len(order)))
    assert np.array_equal(found.shards, again.lookup(np.arange(len(order))).shards)  # a function of seed, epoch
    head = found.windows == 0
    blocks = (found.offsets[head] * 4) // BLOCK  # flat files: tokens from byte 0
    assert (np.diff(blocks) >= 0).all(), "the first window's stripes are not in block order"
    first_stripe = found.shards[head][blocks == 0]
    assert set(first_stripe.tolist()) == set(order.window_shards(0).tolist())
    assert not (np.diff(found.offsets[head][blocks == 0]) >= 0).all(), "a stripe is not shuffled"
    later = found.windows == 1
    later_blocks = (found.offsets[later] * 4) // BLOCK
    assert not (np.diff(later_blocks) >= 0).all(), "the second window should keep the full shuffle"
    # any split of the positions maps them the same way (as ranks and the plan ask)
    split = [order.lookup(np.arange(a, min(a + 777, len(order)))) for a in range(0, len(order), 777)]
    assert np.array_equal(np.concatenate([s.shards for s in split]), found.shards)
    assert np.array_equal(np.concatenate([s.offsets for s in split]), found.offsets)


def test_npy_stripes_count_blocks_from_where_the_tokens_start(tmp_path):
    manifest = write_counting_corpus(tmp_path / "data", LENGTHS, fmt="npy", block_size=BLOCK)
    with make(str(tmp_path / "data"), {}, str(tmp_path / "cache")) as it:
        index, spec = it.index, it.order_spec
        base, _ = index.token_bytes
        assert (base > 0).all() and (base == manifest.sizes - manifest.tokens * 4).all()
        order = EpochOrder(index, spec, 0)
        found = order.lookup(np.arange(len(order)))
        head = found.windows == 0
        blocks = (base[found.shards[head]] + found.offsets[head] * 4) // BLOCK
        assert (np.diff(blocks) >= 0).all()
        firsts = rows_of(it)
    assert sorted(firsts) == sorted(expected_firsts(manifest, SEQ))


def test_a_cold_npy_first_window_is_served_from_blocks_with_its_header_checked(s3_bucket, fault_proxy, tmp_path):
    manifest = write_counting_corpus(s3_bucket.path / "data", LENGTHS, fmt="npy", block_size=BLOCK)
    proxy = fault_proxy(s3_bucket, FaultPlan(latency_s=0.002, bandwidth_bps=SLOW), seed=3)
    with make(f"{s3_bucket.url}/data", s3_bucket.storage_options(proxy.url), str(tmp_path / "cache")) as it:
        stream = iter(it)
        first = next(stream)
        served = it.stats()["blocks_served"]
        proxy.update(bandwidth_bps=None)
        firsts = rows_of([first, *stream])
    assert served > 0
    assert sorted(firsts) == sorted(expected_firsts(manifest, SEQ))


def test_a_corrupted_block_from_the_origin_is_never_served(s3_bucket, fault_proxy, tmp_path):
    manifest, proxy, url, options = slow_corpus(s3_bucket, fault_proxy, flip_p=0.3)
    with make(url, options, str(tmp_path / "cache")) as it:
        stream = iter(it)
        first = next(stream)
        served = it.stats()["blocks_served"]
        flips = proxy.faults.get("flip", 0)
        proxy.update(bandwidth_bps=None)
        firsts = rows_of([first, *stream])
    assert served > 0 and flips > 0, (served, proxy.faults)
    assert sorted(firsts) == sorted(expected_firsts(manifest, SEQ))


def test_a_state_saved_mid_first_window_resumes_exactly_in_a_new_process(s3_bucket, fault_proxy, tmp_path):
    manifest, proxy, url, options = slow_corpus(s3_bucket, fault_proxy)
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def spec(cache: str) -> str:
        return json.dumps({"url": url, "storage_options": options, "cache": str(tmp_path / cache)})

    first_out, second_out, whole_out = tmp_path / "first.json", tmp_path / "second.json", tmp_path / "whole.json"
    proc = subprocess.Popen([sys.executable, "-m", "tests.iterator.stripe_worker", spec("cache"), "-",
                             str(first_out), "6"], env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while not first_out.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first_out.exists(), "the first process never saved its state"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    saved = json.loads(first_out.read_text())
    assert saved["blocks_served"] > 0, "the state was not saved while the first window came from blocks"
    proxy.update(bandwidth_bps=None)
    for args in ((spec("cache"), str(first_out), str(second_out)), (spec("cache-whole"), "-", str(whole_out))):
        subprocess.run([sys.executable, "-m", "tests.iterator.stripe_worker", *args, "-1"], env=env, cwd=REPO,
                       check=True, timeout=300)
    first, second = saved["batches"], json.loads(second_out.read_text())["batches"]
    whole = json.loads(whole_out.read_text())["batches"]
    assert len(first) == 6  # past the first stripe (64 samples): the resumed one starts at block 1
    assert first + second == whole
    assert sorted(t for b in whole for t in b) == sorted(expected_firsts(manifest, SEQ))


def test_a_version_1_state_mid_first_window_resumes_that_epoch_in_its_unstriped_order(tmp_path):
    """An older stager's state (version 1: every window fully shuffled) finishes its epoch in that order, every
    sample once; a state saved meanwhile says version 1 again, and the next epoch is striped."""
    manifest = write_counting_corpus(tmp_path / "data", LENGTHS, block_size=BLOCK)
    url, cache = str(tmp_path / "data"), str(tmp_path / "cache")
    with make(url, {}, cache) as it:
        unstriped = EpochOrder(it.index, it.order_spec, 0, striped=False)
        stream = iter(it)
        head = [next(stream) for _ in range(5)]  # mid-way through the first window
        saved = {**it.state_dict(), "version": 1}  # as an older stager would have saved the same point
    read = 5 * SETTINGS["batch_size"]
    # What the older stager had read: the first positions of the unstriped order.
    found = unstriped.lookup(np.arange(read))
    base = np.concatenate([[0], np.cumsum(manifest.tokens)[:-1]])  # a counting corpus: shard s starts there
    older = (base[found.shards] + found.offsets).tolist()
    with make(url, {}, cache) as it:
        it.load_state_dict(saved)
        assert it.state_dict()["version"] == 1
        rest = list(it)
        assert it.state_dict()["version"] == 2  # the next epoch: striped again
        striped_next = EpochOrder(it.index, it.order_spec, 1)
        assert it._order(1).stripes is not None and striped_next.stripes is not None
    firsts = older + rows_of(rest)
    assert sorted(firsts) == sorted(expected_firsts(manifest, SEQ))  # every sample once, in the old order
    assert rows_of(head) != older  # the striped order differs from the old one: the version mattered


@pytest.mark.parametrize("fmt", ["bin", "npy"])
def test_a_stream_resumed_in_a_later_window_serves_its_first_batch_from_blocks(s3_bucket, fault_proxy, tmp_path,
                                                                               fmt):
    """A job restarted from a checkpoint lands in a fully shuffled later window: its first batch needs one block
    per sample, not the whole window."""
    manifest = write_counting_corpus(s3_bucket.path / "data", LENGTHS, fmt=fmt, block_size=BLOCK)
    proxy = fault_proxy(s3_bucket, FaultPlan(latency_s=0.002), seed=3)
    url, options = f"{s3_bucket.url}/data", s3_bucket.storage_options(proxy.url)
    with make(url, options, str(tmp_path / "before")) as it:
        order = EpochOrder(it.index, it.order_spec, 0)
        into_second = int(manifest.tokens[order.window_shards(0)].sum()) // SEQ + 3 * SETTINGS["batch_size"]
        stream = iter(it)
        head = [next(stream) for _ in range(-(-into_second // SETTINGS["batch_size"]))]
        saved = it.state_dict()
        window = order.lookup(np.array([into_second])).windows[0]
    assert window == 1
    window_bytes = int(manifest.sizes[order.window_shards(1)].sum())
    proxy.update(bandwidth_bps=SLOW)
    with make(url, options, str(tmp_path / "after")) as it:  # a new node: a cold cache
        it.load_state_dict(saved)
        before = proxy.bytes_forwarded
        stream = iter(it)
        first = next(stream)
        fetched = proxy.bytes_forwarded - before
        served = it.stats()["blocks_served"]
        proxy.update(bandwidth_bps=None)
        rest = list(stream)
    assert served > 0
    assert fetched < window_bytes / 8, f"{fetched:,} bytes fetched for the first batch, the window is {window_bytes:,}"
    assert sorted(rows_of([*head, first, *rest])) == sorted(expected_firsts(manifest, SEQ))
