"""``stager stage`` as a real process: SIGKILL at random points, two processes at once, summaries."""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

from stager.cache import BlobState, CacheTier
from stager.config import CacheConfig, FetchConfig
from stager.manifest import MANIFEST_PATH
from tests.cache.blobs import resident_pages
from stager.write import generate_corpus
from tests.engine.corpus import assert_cache_matches, make_corpus
from stager.loopback.fault_plan import FaultPlan

from .runner import STAGER, assert_one_line_error, run, start

CONCURRENCY = 4


def shard_bytes_served(origin) -> int:
    """Bytes of shard bodies the origin sent (ranges of 206 answers), manifest reads left out."""
    total = 0
    for record in origin.requests:
        if record.method == "GET" and record.status == 206 and MANIFEST_PATH not in record.path:
            start, end = record.range.removeprefix("bytes=").split("-")
            total += int(end) - int(start) + 1
    return total


def stage_args(url, cache, *extra):
    return ["stage", url, "--cache", str(cache), "--capacity", "200MB", "--concurrency", str(CONCURRENCY),
            "--no-hedge", "--json", *extra]


def test_sigkill_at_random_points_then_restart_completes_without_refetching(http_origin, fault_proxy, tmp_path):
    manifest = make_corpus(http_origin.root / "corpus", shards=64, tokens=160_000)  # ~20 MB, 5 blocks/shard
    proxy = fault_proxy(http_origin, FaultPlan(bandwidth_bps=1_000_000))  # ~20 s for a full run: 20+ kills fit
    url = f"{proxy.url}/corpus"
    rng = random.Random(20261129)
    kills = 0
    for _ in range(22):
        proc = start(stage_args(url, tmp_path / "cache"))
        time.sleep(rng.uniform(0.6, 1.6))  # start-up is ~0.5-1 s: kills land before, during and between blocks
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        kills += 1
        with CacheTier(CacheConfig(tmp_path / "cache", capacity=200 << 20)) as cache:  # consistent after each kill
            for entry in manifest:
                if cache.state(entry.digest) is BlobState.COMPLETE:
                    assert cache.complete_path(entry.digest).read_bytes() == (
                        http_origin.root / "corpus" / entry.path).read_bytes()
    assert kills >= 20
    result = run(stage_args(url, tmp_path / "cache"), timeout=120)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["failed"] == 0 and summary["blobs"] == len(manifest)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=200 << 20)) as cache:
        assert_cache_matches(cache, manifest, http_origin.root / "corpus")
    refetched = shard_bytes_served(http_origin) - manifest.total_bytes
    # In flight at a kill: at most CONCURRENCY requests, each of up to request_bytes (here a whole shard).
    request = min(FetchConfig().request_bytes, int(manifest.sizes.max()))
    in_flight_bound = kills * CONCURRENCY * request
    assert 0 <= refetched <= in_flight_bound, (refetched, in_flight_bound)


def test_two_processes_on_one_cache_fetch_each_blob_once(http_origin, fault_proxy, tmp_path):
    manifest = make_corpus(http_origin.root / "corpus", shards=16)
    proxy = fault_proxy(http_origin, FaultPlan(bandwidth_bps=4_000_000))
    url = f"{proxy.url}/corpus"
    procs = [start(stage_args(url, tmp_path / "cache")) for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    summaries = [json.loads(out) for out, _ in outputs]
    assert sum(s["fetched_bytes"] for s in summaries) == manifest.total_bytes
    assert shard_bytes_served(http_origin) == manifest.total_bytes
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=200 << 20)) as cache:
        assert_cache_matches(cache, manifest, http_origin.root / "corpus")


def test_second_run_fetches_nothing_and_status_and_verify_report(http_origin, tmp_path):
    manifest = make_corpus(http_origin.root / "corpus", shards=4)
    url = f"{http_origin.url}/corpus"
    first = json.loads(run(stage_args(url, tmp_path / "cache"), check=True).stdout)
    assert first["fetched_bytes"] == manifest.total_bytes
    second = json.loads(run(stage_args(url, tmp_path / "cache"), check=True).stdout)
    assert second["fetched_bytes"] == 0 and second["cached_bytes"] == manifest.total_bytes
    status = json.loads(run(["status", "--cache", str(tmp_path / "cache"), "--json"], check=True).stdout)
    assert status["complete_blobs"] == 4 and status["datasets"][0]["complete"] == 4
    # corrupt one cached blob on disk: verify finds it, drops it, and the next stage fetches it again
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=200 << 20)) as cache:
        victim = cache.complete_path(manifest.digest(2))
    victim.chmod(0o644)
    data = bytearray(victim.read_bytes())
    data[100] ^= 1
    victim.write_bytes(bytes(data))
    result = run(["verify", "--cache", str(tmp_path / "cache"), "--json"])
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert [bad["digest"] for bad in report["bad"]] == [manifest.digest(2)]
    third = json.loads(run(stage_args(url, tmp_path / "cache"), check=True).stdout)
    assert third["fetched_bytes"] == manifest.sizes[2]
    assert run(["verify", "--cache", str(tmp_path / "cache")]).returncode == 0


def test_origin_down_exits_non_zero_naming_the_shard(http_origin, fault_proxy, tmp_path):
    make_corpus(http_origin.root / "corpus", shards=2)
    proxy = fault_proxy(http_origin, FaultPlan(slowdown_p=1.0, path_contains="shard-"))  # shards only: the manifest loads
    result = run(stage_args(f"{proxy.url}/corpus", tmp_path / "cache", "--retry-deadline", "2"), timeout=60)
    assert result.returncode == 1
    assert "could not be staged" in result.stderr and "shard-0000" in result.stderr


def test_dataset_larger_than_the_cache_is_refused_up_front(http_origin, tmp_path):
    manifest = make_corpus(http_origin.root / "corpus", shards=4)
    result = run(["stage", f"{http_origin.url}/corpus", "--cache", str(tmp_path / "cache"),
                  "--capacity", str(manifest.total_bytes // 2)])
    assert_one_line_error(result, "do not fit", "--limit")
    limited = run(["stage", f"{http_origin.url}/corpus", "--cache", str(tmp_path / "cache"),
                   "--capacity", str(manifest.total_bytes // 2), "--limit", str(manifest.total_bytes // 3), "--json"])
    assert limited.returncode == 0, limited.stderr
    assert 1 <= json.loads(limited.stdout)["blobs"] < 4


def test_a_dataset_that_fits_in_bytes_but_not_in_the_caches_allocation_units_is_refused_up_front(http_origin,
                                                                                                    tmp_path):
    # The cache charges each blob its size rounded up to the disk's allocation unit (4 KiB at least):
    # 2 shards of 2,000 bytes take 8,192 bytes of an 8,000-byte cache. The up-front check added the
    # bare sizes, let the run start, and the second shard waited out the retry deadline for room that
    # could never come, then failed (120 s with the default deadline).
    manifest = generate_corpus(http_origin.root / "corpus", shards=2, tokens_per_shard=1000, jitter=0.0, seed=1)
    assert manifest.total_bytes == 4000
    began = time.monotonic()
    result = run(["stage", f"{http_origin.url}/corpus", "--cache", str(tmp_path / "cache"), "--capacity", "8000"],
                 timeout=60)
    assert_one_line_error(result, "do not fit", "--limit")
    assert time.monotonic() - began < 20, "the refusal came after a wait for room"
    limited = run(["stage", f"{http_origin.url}/corpus", "--cache", str(tmp_path / "cache"), "--capacity", "8000",
                   "--limit", "2000", "--json"], timeout=60)
    assert limited.returncode == 0, limited.stderr
    assert json.loads(limited.stdout)["blobs"] == 1


def test_staged_shards_go_through_the_page_cache_unless_direct_writes_are_asked(http_origin, tmp_path):
    manifest = make_corpus(http_origin.root / "corpus", shards=3)
    url = f"{http_origin.url}/corpus"
    resident = {}
    for flag in ("--direct-writes", "--buffered-writes", None):  # None: the default
        cache_dir = tmp_path / (flag or "default").strip("-")
        run(stage_args(url, cache_dir, *([flag] if flag else [])), check=True)
        with CacheTier(CacheConfig(cache_dir, capacity=200 << 20)) as cache:
            paths = [cache.complete_path(entry.digest) for entry in manifest]
        counts = [resident_pages(path) for path in paths]
        resident[flag] = (sum(r for r, _ in counts), sum(p for _, p in counts))
        assert [path.read_bytes() for path in paths] == [
            (http_origin.root / "corpus" / entry.path).read_bytes() for entry in manifest]
    in_cache, pages = resident["--buffered-writes"]
    if in_cache == 0 or resident[None][0] == 0:
        pytest.skip("the kernel dropped the buffered copy's pages at once: nothing to compare with")
    # whole pages went straight to the disk; at most each shard's last, partial page was buffered
    assert resident["--direct-writes"][0] <= len(manifest) and in_cache > pages // 2
    assert resident[None][0] > resident[None][1] // 2  # the default is buffered


def test_the_manifest_is_the_first_request_one_get_and_read_once(http_origin, tmp_path):
    # The manifest's GET goes out while the engine's modules load (cli/head_start.py); its bytes are
    # then used, not read a second time.
    manifest = make_corpus(http_origin.root / "corpus", shards=4)
    run(stage_args(f"{http_origin.url}/corpus", tmp_path / "cache"), check=True)
    asked = http_origin.requests
    of_manifest = [r for r in asked if MANIFEST_PATH in r.path]
    assert [(r.method, r.range, r.status) for r in of_manifest] == [("GET", None, 200)], of_manifest
    assert asked[0] is of_manifest[0]
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=200 << 20)) as cache:
        assert_cache_matches(cache, manifest, http_origin.root / "corpus")


def test_a_corrupted_first_read_of_the_manifest_is_refused_and_read_again(http_origin, fault_proxy, tmp_path):
    # The early GET's bytes are verified as every manifest read is: a flipped byte there is never
    # believed; the usual load reads it again under the retry budget.
    manifest = make_corpus(http_origin.root / "corpus", shards=4)
    proxy = fault_proxy(http_origin, FaultPlan(flip_p=1.0, path_contains=MANIFEST_PATH, max_faults=1))
    run(stage_args(f"{proxy.url}/corpus", tmp_path / "cache"), check=True)
    assert proxy.faults.get("flip", 0) == 1
    assert [r.method for r in http_origin.requests if MANIFEST_PATH in r.path] == ["GET", "GET"]
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=200 << 20)) as cache:
        assert_cache_matches(cache, manifest, http_origin.root / "corpus")


def test_the_early_manifest_read_names_the_path_the_manifest_package_does():
    from stager.cli.head_start import MANIFEST_PATH as EARLY

    assert EARLY == MANIFEST_PATH


def test_a_stalled_first_read_of_the_manifest_is_given_up_within_the_retry_deadline(http_origin, fault_proxy,
                                                                                     tmp_path):
    # The early GET is one attempt bounded like any other: a stall there costs at most the deadline, and
    # the usual load then reads the manifest.
    manifest = make_corpus(http_origin.root / "corpus", shards=2)
    proxy = fault_proxy(http_origin, FaultPlan(spike_p=1.0, spike_s=60.0, path_contains=MANIFEST_PATH, max_faults=1))
    began = time.monotonic()
    run(stage_args(f"{proxy.url}/corpus", tmp_path / "cache", "--retry-deadline", "3"), check=True, timeout=60)
    assert time.monotonic() - began < 30, "waited out the stalled read"
    assert proxy.faults.get("spike", 0) == 1
    assert [r.method for r in http_origin.requests if MANIFEST_PATH in r.path] == ["GET"]  # the stalled one never got through
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=200 << 20)) as cache:
        assert_cache_matches(cache, manifest, http_origin.root / "corpus")


def test_durable_commits_each_shard_synced_and_the_default_leaves_them_to_the_kernel(http_origin, tmp_path):
    manifest = make_corpus(http_origin.root / "corpus", shards=2)
    url = f"{http_origin.url}/corpus"
    boots = {}
    for flag in ("--durable", None):
        cache_dir = tmp_path / (flag or "default").strip("-")
        run(stage_args(url, cache_dir, *([flag] if flag else [])), check=True)
        with CacheTier(CacheConfig(cache_dir, capacity=200 << 20)) as cache:
            boots[flag] = {cache._index.get(entry.digest).volatile_boot for entry in manifest}
            this_boot = cache._boot
    assert boots["--durable"] == {None}  # fsynced: nothing for a reboot to take back
    assert boots[None] == {this_boot}  # not waited for: a reboot makes every reader hash them


#: The CPUs this test process may use, as it starts (a stage run in this process keeps to one: see runner.run_here).
CPUS = sorted(os.sched_getaffinity(0))


def threads_cpus(pid: int) -> list[str]:
    """Each thread's allowed CPUs, as /proc lists them ("0-1", "1"); [] once the process is gone."""
    lists = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            status = (task / "status").read_text()
        except OSError:
            continue
        lists += [line.split()[1] for line in status.splitlines() if line.startswith("Cpus_allowed_list:")]
    return lists


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")
def test_many_shards_at_a_high_concurrency_stage_within_a_small_limit_of_open_files(http_origin, fault_proxy,
                                                                                    tmp_path):
    """Each blob being fetched holds its partial file open. A run of 600 shards at `--concurrency 2048`
    under a limit of 256 open files once began every shard at once and failed most with "Too many open
    files": now it begins shards as the prefetcher reaches them, within what the limit has room for."""
    manifest = make_corpus(http_origin.root / "corpus", shards=600, tokens=40_000)  # 80 KB, 2 blocks each
    proxy = fault_proxy(http_origin, FaultPlan(latency_s=0.2))  # each shard's job stays open a while

    def small_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    args = ["stage", f"{proxy.url}/corpus", "--cache", str(tmp_path / "cache"), "--capacity", "4GB",
            "--concurrency", "2048", "--json"]
    result = subprocess.run([*STAGER, *args], capture_output=True, text=True, timeout=120, preexec_fn=small_limit,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert summary["failed"] == 0 and summary["blobs"] == len(manifest)
    with CacheTier(CacheConfig(tmp_path / "cache", capacity=200 << 20)) as cache:
        assert_cache_matches(cache, manifest, http_origin.root / "corpus")


def test_on_two_cpus_every_thread_of_a_stage_keeps_to_one_unless_told_otherwise(http_origin, fault_proxy,
                                                                                 tmp_path):
    manifest = make_corpus(http_origin.root / "corpus", shards=16)  # about 5 MB
    proxy = fault_proxy(http_origin, FaultPlan(bandwidth_bps=2_000_000))  # a few seconds: time to look at it
    two = set(CPUS[:2])
    allowed = {}
    for flag in (None, "--any-cpu"):
        cache = tmp_path / (flag or "default").strip("-")
        proc = subprocess.Popen([*STAGER, *stage_args(f"{proxy.url}/corpus", cache, *([flag] if flag else []))],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: os.sched_setaffinity(0, two))
        seen: set[str] = set()
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            lists = threads_cpus(proc.pid)
            if len(lists) > 3:  # the engine's threads are up
                seen.update(lists)
            time.sleep(0.05)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        summary = json.loads(out)
        assert summary["failed"] == 0 and summary["blobs"] == len(manifest)
        allowed[flag] = seen
    assert len(allowed[None]) == 1 and allowed[None] <= {str(cpu) for cpu in two}, allowed
    low, high = sorted(two)
    assert allowed["--any-cpu"] == {f"{low}-{high}" if high == low + 1 else f"{low},{high}"}, allowed
    bad = run(stage_args(f"{proxy.url}/corpus", tmp_path / "bad"), env={"STAGER_ONE_CPU": "sometimes"})
    assert_one_line_error(bad, "STAGER_ONE_CPU")
