"""End to end through an origin that corrupts a third of its GET bodies: every byte delivered is the origin's.

``rclone serve s3`` on loopback behind the fault proxy: 30% of GET bodies
have one byte flipped, 2.5% are truncated and 2.5% reset, the manifest's own
included. ``stager stage``, a two-rank TokenDataset epoch (gloo, real
processes) resumed in new processes and then at another world size, and
``stager mount`` with every file read: each completes, and what it delivers
equals the origin, byte for byte.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stager.cache import CacheTier
from stager.config import CacheConfig
from stager.manifest import MANIFEST_PATH
from stager.loopback.fault_plan import Fault, FaultPlan
from tests.cli.runner import run
from tests.iterator.corpus import expected_firsts, write_counting_corpus

REPO = Path(__file__).resolve().parents[2]
#: One flipped byte in 30% of GET bodies, 5% cut short (half truncated, half reset).
FAULTS = dict(flip_p=0.30, truncate_p=0.025, reset_p=0.025)
BLOCK = 64 * 1024
# Few, large-ish shards: a few MiB in all, so each test takes seconds.
LENGTHS = [120_000 + 7_919 * i for i in range(6)]


@pytest.fixture
def origin(s3_bucket, fault_proxy):
    """The dataset in a real bucket, and the corrupting proxy in front of it."""
    manifest = write_counting_corpus(s3_bucket.path / "ds", LENGTHS, block_size=BLOCK)
    # Seed 39 flips a byte in each of the first three GETs: the first reads of the manifest are bad for sure.
    proxy = fault_proxy(s3_bucket, FaultPlan(**FAULTS), seed=39)
    return s3_bucket, manifest, proxy, f"{s3_bucket.url}/ds"


def origin_bytes(bucket, path: str) -> bytes:
    return (bucket.path / "ds" / path).read_bytes()


def assert_faults_were_injected(proxy, manifest_gets_at_least: int = 1) -> None:
    faults = proxy.faults
    assert faults.get("flip", 0) >= 3, faults
    gets = [e for e in proxy.events if e.method == "GET" and e.path.endswith(MANIFEST_PATH)]
    assert len(gets) >= manifest_gets_at_least + 2
    assert all(Fault.FLIP in e.faults for e in proxy.events[:2]), proxy.events[:2]  # so it was read again


def test_stage_through_a_corrupting_origin_caches_exactly_the_origins_bytes(origin, tmp_path):
    bucket, manifest, proxy, url = origin
    cache = tmp_path / "cache"
    result = run(["stage", url, "--cache", str(cache), "--capacity", "1GB", "--no-daemon", "--retry-deadline", "60",
                  "--json"], env=bucket.env(proxy.url), timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["failed"] == 0 and summary["blobs"] == len(manifest)
    with CacheTier(CacheConfig(cache, capacity=1 << 30), reconcile=False) as tier:
        for i, path in enumerate(manifest.paths):
            assert tier.complete_path(manifest.digest(i)).read_bytes() == origin_bytes(bucket, path), path
    assert_faults_were_injected(proxy)


def _job(tmp_path: Path, name: str, bucket, proxy, url: str, world: int, steps: int,
         state_in: str | None = None, state_rank: int | None = None) -> list[int]:
    """Run one training job of ``world`` ranks to its end; returns the first tokens of every sample it saw."""
    out = str(tmp_path / name)
    config = dict(url=url, storage_options=bucket.storage_options(proxy.url), cache=str(tmp_path / f"cache-{name}"),
                  world_size=world, rendezvous=str(tmp_path / f"rendezvous-{name}"), state_in=state_in,
                  state_rank=state_rank, steps=steps, out=out)
    config_path = tmp_path / f"{name}.json"
    config_path.write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.integration.rank_worker", str(config_path), str(rank)],
                              env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
             for rank in range(world)]
    errors = []
    try:
        for rank, proc in enumerate(procs):
            _, stderr = proc.communicate(timeout=300)
            if proc.returncode != 0:
                errors.append(f"rank {rank} of {name} exited {proc.returncode}:\n{stderr[-3000:]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=30)
    assert not errors, "\n".join(errors)
    seen = []
    for rank in range(world):
        batches = json.loads(Path(f"{out}.{rank}.json").read_text())
        if steps > 0:
            assert len(batches) == steps, (name, rank, len(batches))
        seen += [first for batch in batches for first in batch]
    return seen


def test_a_two_rank_epoch_resumed_in_new_processes_then_at_three_ranks_sees_every_sample_once(origin, tmp_path):
    pytest.importorskip("torch")
    bucket, manifest, proxy, url = origin
    from tests.integration.rank_worker import SEQ_LEN

    seen = _job(tmp_path, "first", bucket, proxy, url, world=2, steps=4)
    # The same job resumed in new processes (and on a cold cache: everything through the origin again).
    seen += _job(tmp_path, "resumed", bucket, proxy, url, world=2, steps=4, state_in=str(tmp_path / "first"))
    # An elastic resume: three ranks from rank 0's checkpoint (it holds the global position), to the epoch's end.
    seen += _job(tmp_path, "elastic", bucket, proxy, url, world=3, steps=-1, state_in=str(tmp_path / "resumed"),
                 state_rank=0)
    assert len(seen) == len(set(seen)), "a sample was served twice"
    assert sorted(seen) == sorted(expected_firsts(manifest, SEQ_LEN))  # every sample, each of the origin's tokens
    assert_faults_were_injected(proxy, manifest_gets_at_least=7)  # every process read the manifest through it


def test_mount_and_read_every_file_through_a_corrupting_origin(origin, tmp_path):
    pytest.importorskip("pyfuse3")
    from stager.fuse import check_fuse
    from tests.fuse.mounts import Mount

    check_fuse()
    bucket, manifest, proxy, url = origin
    mount = Mount(url, tmp_path / "m", "--retry-deadline", "60", env=bucket.env(proxy.url))
    try:
        mount.start()
        for path in manifest.paths:
            assert (mount.path / path).read_bytes() == origin_bytes(bucket, path), path
        assert sorted(str(p.relative_to(mount.path)) for p in mount.path.rglob("*") if p.is_file()) == \
            sorted(manifest.paths)
    finally:
        mount.stop()
    assert_faults_were_injected(proxy)
