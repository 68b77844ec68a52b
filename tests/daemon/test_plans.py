"""The daemon's plan registry over a real engine: replacing, resuming at a cursor, leases, dead consumers."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from stager.cache import CacheTier
from stager.config import CacheConfig, FetchConfig, SourceConfig
from stager.daemon.plans import PlanRegistry, identify
from stager.daemon_client.protocol import UnknownPlan
from stager.engine import Engine


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def engine(tmp_path, corpus):
    cache = CacheTier(CacheConfig(directory=tmp_path / "cache", capacity=1 << 30))
    async with Engine(cache, FetchConfig(concurrency=2)) as engine:
        yield engine
    cache.close()


@pytest.fixture
async def dataset(engine, corpus):
    return await engine.open_dataset(SourceConfig(str(corpus.root)))


async def test_registering_a_plan_id_again_replaces_it_and_resumes_at_the_cursor(engine, dataset):
    registry = PlanRegistry(engine, lease=60)
    first = await registry.register("c", "k", "p", dataset, None, fingerprint="f" * 32)
    second = await registry.register("c", "k", "p", dataset, np.array([7, 6, 5, 4]), fingerprint="f" * 32, cursor=2)
    assert registry.get("c", "k", "p").plan is second and engine._plans == [second], "the old plan is closed"
    assert first._task.done()
    assert (second.cursor, len(second)) == (2, 4)
    # Positions before the cursor are neither fetched nor protected from eviction.
    assert second.window_digests() == {dataset.manifest.digest(5), dataset.manifest.digest(4)}
    assert (await registry.register("c", "k", "q", dataset, None, fingerprint="f" * 32, cursor=99)).cursor == 8


async def test_unknown_plans_say_to_register_again(engine, dataset):
    registry = PlanRegistry(engine, lease=60)
    with pytest.raises(UnknownPlan, match="register it again"):
        registry.get("nobody", "k", "p")
    await registry.register("c", "k", "p", dataset, None, fingerprint="f" * 32)
    with pytest.raises(UnknownPlan):
        registry.get("c", "k", "other")
    assert await registry.close("c", "k", "p") and not await registry.close("c", "k", "p")
    assert engine._plans == []


async def test_a_consumer_whose_lease_runs_out_loses_its_plans(engine, dataset):
    clock = Clock()
    registry = PlanRegistry(engine, lease=30, clock=clock)
    await registry.register("idle", "k", "p", dataset, None, fingerprint="f" * 32)
    await registry.register("busy", "k", "p", dataset, None, fingerprint="f" * 32)
    clock.now += 20
    registry.get("busy", "k", "p")  # any request renews the lease
    clock.now += 20
    registry.seen("busy", "k")  # so does a heartbeat
    assert await registry.expire() == ["idle"]
    assert [c.id for c in registry.consumers] == ["busy"] and len(engine._plans) == 1
    with pytest.raises(UnknownPlan):
        registry.get("idle", "k", "p")
    clock.now += 31
    assert await registry.expire() == ["busy"] and engine._plans == []


async def test_a_consumer_whose_process_died_is_dropped_at_once(engine, dataset):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        registry = PlanRegistry(engine, lease=3600)
        await registry.register("gone", "k", "p", dataset, None, fingerprint="f" * 32, pid=child.pid)
        await registry.register("alive", "k", "p", dataset, None, fingerprint="f" * 32, pid=os.getpid())
        await registry.register("unknown", "k", "p", dataset, None, fingerprint="f" * 32, pid=None)
        assert await registry.expire() == []
    finally:
        child.kill()
        child.wait()
    assert await registry.expire() == ["gone"]
    assert sorted(c.id for c in registry.consumers) == ["alive", "unknown"]
    assert registry.dropped_consumers == 1


def test_identify_needs_a_visible_pid():
    assert identify(None) is None and identify(0) is None
    me = identify(os.getpid())
    assert me is not None and me.pid == os.getpid()
