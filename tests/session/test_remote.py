"""RemoteSession against a real daemon on the test's loop: readiness, leases, restarts, fallback, choosing.

The daemon is stopped and started again under the session's feet, as a
restart on a node would; the session must keep handing out the right files
in the right order, registering its plan again at its cursor, or move to an
engine of its own when no daemon comes back.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from stager.cache import CacheTier
from stager.config import CacheConfig, FetchConfig, SourceConfig
from stager.errors import DaemonUnavailable
from stager.errors import ConfigError, DaemonError, ManifestError
from stager.session import EmbeddedSession, RemoteSession, open_session
from tests.daemon.node import corpus, node  # noqa: F401  (fixtures)
from tests.daemon.support import wait_until


def _original(node, index: int) -> bytes:
    return (node.corpus.root / node.corpus.manifest.paths[index]).read_bytes()


def _forget(node, indexes) -> None:
    """Remove blobs from the cache (no daemon running), so that reading them needs one."""
    with CacheTier(node.cache) as cache:
        for index in indexes:
            cache.remove(node.corpus.manifest.digest(index))


async def _read(node, plan, positions, order) -> None:
    for position in positions:
        path = await plan.ready(position)
        assert path.read_bytes() == _original(node, order[position]), f"position {position}"
        await plan.advance(position + 1)


async def test_plans_readiness_and_cleanup_through_the_daemon(node):
    daemon = await node.start()
    session = node.session()
    dataset = await session.open_dataset(SourceConfig(node.proxy.url))
    assert dataset.manifest.total_bytes == node.corpus.manifest.total_bytes and dataset.url == node.proxy.url
    order = [5, 2, 7, 0]
    plan = await session.plan(dataset, order, window_bytes=1 << 20, name="epoch-0")
    await _read(node, plan, range(2), order)
    (status,) = (await daemon.status())["plans"]
    assert (status["consumer"], status["cursor"], status["length"]) == (session.consumer_id, 2, 4)
    with pytest.raises(IndexError):
        await plan.ready(4)
    with pytest.raises(IndexError):
        await session.plan(dataset, [0, 8])
    await plan.close()
    assert (await daemon.status())["plans"] == []
    await session.close()
    assert daemon.registry.consumers == []
    stats = session.stats()
    assert stats["consumer_waits"] == 2 and stats["daemon_fallback"] == 0


async def test_a_restarted_daemon_gets_the_plan_again_at_the_cursor(node):
    first = await node.start()
    session = node.session(reconnect_timeout=20)
    dataset = await session.open_dataset(SourceConfig(node.proxy.url))
    order = list(range(8))[::-1]
    plan = await session.plan(dataset, order)
    await _read(node, plan, range(3), order)
    await first.stop()
    _forget(node, order[3:])  # whatever was prefetched ahead is gone: the rest must be asked for

    waiting = asyncio.ensure_future(plan.ready(3))  # the daemon is gone: the session backs off and waits
    await asyncio.sleep(0.5)
    assert not waiting.done()
    second = await node.start()
    path = await waiting
    assert path.read_bytes() == _original(node, order[3])
    (status,) = (await second.status())["plans"]
    assert status["cursor"] == 3, "registered again where the consumer was, not at 0"
    await plan.advance(4)
    await _read(node, plan, range(4, 8), order)
    assert session.reconnects == 1 and session.mode == "daemon"


async def test_heartbeats_register_plans_again_while_the_consumer_is_quiet(node):
    await node.start(lease=2.0)  # heartbeats every 0.5 s
    session = node.session(reconnect_timeout=20)
    dataset = await session.open_dataset(SourceConfig(node.proxy.url))
    await session.plan(dataset, [1, 2, 3])
    await node.daemons[-1].stop()
    second = await node.start(lease=2.0)
    await asyncio.get_running_loop().run_in_executor(
        None, wait_until, lambda: len(second.registry.plans()) == 1, 10, "the heartbeat to register the plan again")
    assert second.registry.plans()[0].consumer == session.consumer_id
    # Heartbeats also bring the daemon's node-wide counters into the consumer's stats.
    await asyncio.get_running_loop().run_in_executor(
        None, wait_until, lambda: "daemon_bytes_fetched" in session.stats(), 10, "a heartbeat with counters")
    assert session.stats()["daemon_origin_retries"] == 0


async def test_a_consumer_dropped_for_silence_registers_again_on_its_next_call(node):
    daemon = await node.start(lease=1.0)
    session = node.session()
    dataset = await session.open_dataset(SourceConfig(node.proxy.url))
    plan = await session.plan(dataset, [3, 4])
    session._heartbeat.cancel()  # a consumer whose loop does not run between calls sends no heartbeat
    deadline = time.monotonic() + 10
    while daemon.registry.consumers and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert daemon.registry.consumers == [], "the reaper dropped the silent consumer"
    assert (await plan.ready(0)).read_bytes() == _original(node, 3)
    await plan.advance(1)  # the daemon no longer knows the plan: it is registered again, at the cursor
    assert session.daemon.reregistrations == 1
    (registered,) = daemon.registry.plans()
    assert registered.plan.cursor == 1


async def test_a_consumer_whose_id_was_taken_meanwhile_goes_on_as_a_new_one(node):
    daemon = await node.start()
    session = node.session()
    plan = await session.plan(await session.open_dataset(SourceConfig(node.proxy.url)), [3, 4])
    session._heartbeat.cancel()
    old = session.consumer_id
    await daemon.registry.drop(old)  # the daemon forgot it (its lease ran out) ...
    got, _ = await node.raw("PUT", f"/v1/consumers/{old}/plans/p9", json={"dataset": {"url": node.proxy.url}})
    assert got == 200, "... and another process took its id, with a key of its own"
    assert (await plan.ready(0)).read_bytes() == _original(node, 3)
    await plan.advance(1)
    assert session.consumer_id != old
    assert [(r.id, r.plan.cursor) for r in daemon.registry.plans() if r.consumer == session.consumer_id] == [
        (plan.id, 1)]
    assert [r.id for r in daemon.registry.plans() if r.consumer == old] == ["p9"], "the other one's is untouched"
    assert (await plan.ready(1)).read_bytes() == _original(node, 4)


async def test_without_a_daemon_the_session_falls_back_to_its_own_engine(node):
    await node.start()
    session = node.session(fallback=True, reconnect_timeout=0.5)
    dataset = await session.open_dataset(SourceConfig(node.proxy.url))
    order = [6, 1, 4, 3, 0]
    plan = await session.plan(dataset, order)
    await _read(node, plan, range(2), order)
    await node.daemons[-1].stop()
    _forget(node, order[2:])
    await _read(node, plan, range(2, 5), order)
    assert session.mode == "embedded" and session.stats()["daemon_fallback"] == 1
    m = node.corpus.manifest
    assert await session.read_block(dataset, 7, 1) == _original(node, 7)[m.block_size:2 * m.block_size]
    # New plans and datasets go to the fallback engine too.
    again = await session.plan(await session.open_dataset(SourceConfig(node.proxy.url)), [2])
    assert (await again.ready(0)).read_bytes() == _original(node, 2)


async def test_daemon_mode_gives_up_when_the_daemon_stays_away(node):
    await node.start()
    session = node.session(fallback=False, reconnect_timeout=0.5)
    plan = await session.plan(await session.open_dataset(SourceConfig(node.proxy.url)), [0, 1])
    await plan.ready(0)
    await node.daemons[-1].stop()
    _forget(node, [1])
    began = time.monotonic()
    with pytest.raises(DaemonUnavailable, match="did not come back within") as caught:
        await plan.ready(1)
    assert isinstance(caught.value, DaemonError) and time.monotonic() - began < 5


async def test_a_manifest_other_than_the_daemons_is_refused(node):
    await node.start()
    session = node.session()
    m = node.corpus.manifest
    with pytest.raises(ManifestError, match="not the one at the origin now"):
        await session.open_dataset(SourceConfig(node.proxy.url), manifest=m.filter([i != 3 for i in range(len(m))]))


async def test_open_session_picks_the_daemon_only_for_its_own_cache(node, tmp_path):
    await node.start()
    loop = asyncio.get_running_loop()

    async def choose(cache: CacheConfig, mode: str):  # probing blocks: off the loop the daemon runs on
        return await loop.run_in_executor(None, lambda: open_session(cache, FetchConfig(), socket=node.socket,
                                                                     mode=mode))

    mine = await choose(node.cache, "auto")
    assert isinstance(mine, RemoteSession) and mine.fallback
    strict = await choose(node.cache, "daemon")
    assert isinstance(strict, RemoteSession) and not strict.fallback
    other = CacheConfig(directory=tmp_path / "other-cache", capacity=1 << 30)
    (tmp_path / "other-cache").mkdir()
    elsewhere = await choose(other, "auto")
    assert isinstance(elsewhere, EmbeddedSession)
    await elsewhere.close()
    with pytest.raises(DaemonError, match="serves the cache .* not .*other-cache"):
        await choose(other, "daemon")
    embedded = await choose(node.cache, "embedded")
    assert isinstance(embedded, EmbeddedSession)
    await embedded.close()


def test_open_session_without_a_daemon(tmp_path):
    cache = CacheConfig(directory=tmp_path / "cache", capacity=1 << 30)
    session = open_session(cache, socket=tmp_path / "none.sock")
    assert isinstance(session, EmbeddedSession)
    asyncio.run(session.close())
    with pytest.raises(DaemonError, match="no stager daemon answers at .*none.sock; start one with `stager serve`"):
        open_session(cache, socket=tmp_path / "none.sock", mode="daemon")
    with pytest.raises(ConfigError, match="session mode"):
        open_session(cache, mode="sometimes")  # type: ignore[arg-type]


async def test_advances_in_a_burst_are_folded_into_few_requests(node):
    daemon = await node.start()
    session = node.session()
    dataset = await session.open_dataset(SourceConfig(node.proxy.url))
    plan = await session.plan(dataset, [i % 8 for i in range(200)])
    client = session.daemon.client()
    sent = []
    request = client.request

    async def counting(method, path, **kwargs):
        if path.endswith("/advance"):
            sent.append(kwargs["body"]["position"])
        return await request(method, path, **kwargs)

    client.request = counting
    await asyncio.gather(*(plan.advance(position) for position in range(1, 201)))
    assert 1 <= len(sent) <= 3 and sent[-1] == 200, sent
    (registered,) = daemon.registry.plans()
    assert registered.plan.cursor == 200


async def test_a_block_that_changed_on_the_cache_disk_is_fetched_again_not_served(node):
    # The mount (or any consumer) reads single blocks of shared cache files through the session.
    await node.start()
    session = node.session()
    dataset = await session.open_dataset(SourceConfig(node.proxy.url))
    plan = await session.plan(dataset, [3])
    path = await plan.ready(0)
    m = node.corpus.manifest
    offset = m.block_size + 9  # inside block 1
    path.chmod(0o644)
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x08]))
    original = _original(node, 3)
    assert await session.read_block(dataset, 3, 1) == original[m.block_size:2 * m.block_size]
    with CacheTier(node.cache, reconcile=False) as cache:  # the bad copy is gone; what is there is good
        assert not cache.verify(repair=False).bad
    await session.close()
