"""Consumer processes on one daemon: each blob crosses the origin once, and streams survive the daemon dying.

Everything is real: ``python -m stager serve`` in a child process, consumer
processes using ``open_session``, an HTTP origin behind the fault proxy
(whose byte counters are the ground truth for what was fetched), SIGKILL.
"""

from __future__ import annotations

import collections
import types

import pytest

from stager.cache import CacheTier
from stager.config import CacheConfig
from stager.testing import FaultPlan
from tests.daemon.support import (ConsumerProcess, DaemonProcess, assert_stream, make_corpus, remove_dir, short_dir,
                                  wait_until)


@pytest.fixture
def node(tmp_path, http_origin_factory, fault_proxy):
    """A corpus served over HTTP behind the fault proxy, a short socket directory and a cache."""
    work = short_dir()
    corpus = make_corpus(tmp_path / "corpus", shards=16, tokens=40_000, block_size=16 * 1024)
    origin = http_origin_factory(corpus.root)
    proxy = fault_proxy(origin, FaultPlan(latency_s=0.02))
    (work / "cache").mkdir()
    started: list = []

    n = types.SimpleNamespace(corpus=corpus, proxy=proxy, work=work, socket=work / "d.sock", cache=work / "cache")

    def daemon(*args: str) -> DaemonProcess:
        d = DaemonProcess(n.socket, n.cache, args=["--no-hedge", "--concurrency", "8", *args])
        started.append(d)
        return d.start()

    def consumer(name: str, order, **kwargs) -> ConsumerProcess:
        c = ConsumerProcess(tmp_path / f"{name}.jsonl", socket=n.socket, cache=n.cache, source=proxy.url,
                            order=order, **kwargs)
        started.append(c)
        return c.start()

    n.daemon, n.consumer = daemon, consumer
    try:
        yield n
    finally:
        for thing in reversed(started):
            thing.kill()
        remove_dir(work)


def _shard_gets(proxy, corpus) -> collections.Counter:
    paths = {f"/{p}": p for p in corpus.manifest.paths}
    return collections.Counter(paths[e.path] for e in proxy.events if e.method == "GET" and e.path in paths)


def test_four_consumers_with_overlapping_plans_fetch_each_blob_once(node):
    daemon = node.daemon()
    m = node.corpus.manifest
    orders = [[(3 * k + j) % len(m) for j in range(10)] for k in range(4)]
    consumers = [node.consumer(f"c{k}", order) for k, order in enumerate(orders)]
    for c in consumers:
        assert c.wait(120) == 0, c.errors()
    for c, order in zip(consumers, orders, strict=True):
        assert_stream(c, node.corpus, order)
        summary = c.summary()
        assert summary["kind"] == "RemoteSession" and summary["stats"]["daemon_fallback"] == 0
        assert {r["mode"] for r in c.positions()} == {"daemon"}

    union = sorted({i for order in orders for i in order})
    gets = _shard_gets(node.proxy, node.corpus)
    blocks = {m.paths[i]: len(m.block_digests(i)) for i in union}
    # Requests may span several blocks; none is asked twice (the byte count below says so).
    assert set(gets) == set(blocks) and all(gets[p] <= blocks[p] for p in blocks), gets
    shard_bytes = sum(int(m.sizes[i]) for i in union)
    # The manifest is read by the daemon and by each of the 4 consumers; every shard byte crosses once.
    assert node.proxy.stats().bytes_down == shard_bytes + 5 * node.corpus.manifest_size
    daemon.stop()
    assert daemon.wait(30) == 0


def test_sigkilled_daemon_restarted_mid_epoch_leaves_every_stream_complete(node):
    daemon = node.daemon()
    node.proxy.update(latency_s=0.04)
    m = node.corpus.manifest
    orders = [[(5 * k + j) % len(m) for j in range(len(m))] for k in range(3)]
    consumers = [node.consumer(f"c{k}", order, delay=0.05, window=200_000) for k, order in enumerate(orders)]
    wait_until(lambda: all(len(c.positions()) >= 3 for c in consumers), 90, "every consumer to read 3 shards")
    assert all(len(c.positions()) < len(m) for c in consumers), "the kill must come mid-epoch"

    daemon.kill()  # SIGKILL: no drain, a stale socket, partial blobs in the cache
    successor = node.daemon()
    for c in consumers:
        assert c.wait(120) == 0, c.errors()
    for c, order in zip(consumers, orders, strict=True):
        assert_stream(c, node.corpus, order)
        stats = c.summary()["stats"]
        assert stats["daemon_reconnects"] >= 1 and stats["daemon_fallback"] == 0
        assert {r["mode"] for r in c.positions()} == {"daemon"}
    successor.stop()
    assert successor.wait(30) == 0
    with CacheTier(CacheConfig(directory=node.cache, capacity=1 << 30)) as cache:
        report = cache.verify()
    assert report.ok and report.blobs_checked >= len(m)


def test_consumer_falls_back_to_an_embedded_engine_when_the_daemon_stays_dead(node):
    daemon = node.daemon()
    node.proxy.update(latency_s=0.04)
    m = node.corpus.manifest
    order = list(range(len(m)))[::-1]
    consumer = node.consumer("c", order, mode="auto", delay=0.05, reconnect_timeout=1.0, window=200_000)
    wait_until(lambda: len(consumer.positions()) >= 3, 90, "the consumer to read 3 shards")
    daemon.kill()
    assert consumer.wait(120) == 0, consumer.errors()
    assert_stream(consumer, node.corpus, order)
    modes = [r["mode"] for r in consumer.positions()]
    assert modes[0] == "daemon" and modes[-1] == "embedded"
    assert modes == sorted(modes, key=lambda mode: mode == "embedded"), "it falls back once and stays"
    assert consumer.summary()["stats"]["daemon_fallback"] == 1

