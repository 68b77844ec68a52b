"""``stager stage`` on a disk that fills up (issue 14, item 7), on a real 20 MiB tmpfs.

Another program fills the disk while ``stage`` runs with a capacity larger than
the disk: the run fails at once (not after the retry deadline) with one line
naming the cache and its full disk; ``status`` and ``verify`` still work on the
full disk; once room is back, ``stage`` finishes without fetching again what
was verified.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from stager.cache import BlobState, CacheTier
from stager.config import CacheConfig
from stager.loopback.fault_plan import FaultPlan
from tests.cache.small_disk import fill_disk, free_bytes, mounted_tmpfs
from tests.engine.corpus import assert_cache_matches, make_corpus

from .runner import assert_one_line_error, run, start

RETRY_DEADLINE = 120  # the default: a full disk must not wait for it


@pytest.fixture
def disk(tmp_path):
    with mounted_tmpfs(tmp_path / "disk", "20m") as mountpoint:
        yield mountpoint


def stage_args(url, cache, *extra):
    return ["stage", url, "--cache", str(cache), "--capacity", "1GB", "--concurrency", "4", "--no-hedge",
            "--retry-deadline", str(RETRY_DEADLINE), "--no-daemon", "--json", *extra]


def verified_bytes(cache_dir, manifest) -> int:
    total = 0
    with CacheTier(CacheConfig(cache_dir, capacity=1 << 30), reconcile=False) as cache:
        for entry in manifest:
            record = cache.record(entry.digest)
            if record is not None:
                total += entry.size if record.state is BlobState.COMPLETE else \
                    sum(min(entry.size, (b + 1) * record.block_size) - b * record.block_size for b in record.verified)
    return total


def test_stage_fails_fast_on_a_disk_another_program_fills_then_resumes(http_origin, fault_proxy, disk):
    manifest = make_corpus(http_origin.root / "corpus", shards=30, tokens=160_000)  # ~10 MB, fits the disk
    proxy = fault_proxy(http_origin, FaultPlan(bandwidth_bps=2_000_000))  # ~5 s to stage it all
    cache = disk / "cache"
    proc = start(stage_args(f"{proxy.url}/corpus", cache))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:  # some shards in, many to go
        if (cache / "blobs").is_dir() and sum(len(files) for _, _, files in os.walk(cache / "blobs")) >= 4:
            break
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    fill_disk(disk / "filler")
    filled = time.monotonic()
    out, err = proc.communicate(timeout=RETRY_DEADLINE)
    assert time.monotonic() - filled < 20, "the full disk waited for the retry deadline"
    lines = [line for line in err.splitlines() if line.startswith("stager: error:")]
    assert proc.returncode == 1 and len(lines) == 1, err
    assert str(cache) in lines[0] and "disk" in lines[0] and "is full" in lines[0], lines[0]
    assert "Traceback" not in err
    assert free_bytes(disk) < 1 << 20

    # Read-only commands work on the full disk.
    status = run(["status", "--cache", str(cache), "--json"], timeout=60)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["complete_blobs"] >= 4
    verify = run(["verify", "--cache", str(cache)], timeout=60)
    assert verify.returncode == 0, verify.stderr
    # So does a stage that asks for more than the disk holds: refused at once, naming the disk.
    refused = run(stage_args(f"{proxy.url}/corpus", cache), timeout=60)
    assert_one_line_error(refused, str(cache), "disk")

    os.unlink(disk / "filler")  # room comes back
    kept = verified_bytes(cache, manifest)
    assert kept > 0
    again = run(stage_args(f"{http_origin.url}/corpus", cache), timeout=120)  # same data, no bandwidth cap
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["failed"] == 0
    assert summary["cached_bytes"] == kept  # nothing verified was lost...
    assert summary["fetched_bytes"] == manifest.total_bytes - kept  # ...or fetched twice
    with CacheTier(CacheConfig(cache, capacity=1 << 30)) as tier:
        assert_cache_matches(tier, manifest, http_origin.root / "corpus")


def test_stage_refuses_at_once_what_the_disk_cannot_hold(http_origin, disk):
    manifest = make_corpus(http_origin.root / "corpus", shards=80, tokens=160_000)  # ~26 MB > 20 MiB disk
    cache = disk / "cache"
    began = time.monotonic()
    result = run(stage_args(f"{http_origin.url}/corpus", cache), timeout=60)
    assert time.monotonic() - began < 20
    assert_one_line_error(result, str(cache), "disk")
    # what fits is staged
    done = run(stage_args(f"{http_origin.url}/corpus", cache, "--limit", "12MB"), timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["failed"] == 0
    assert manifest.total_bytes > 20 << 20
