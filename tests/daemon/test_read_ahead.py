"""A plan's read-ahead through the daemon: the floor and seconds a consumer asks for reach the engine, and
/v1/status and /metrics show each plan's measured rate and how far ahead it stages."""

from __future__ import annotations

import asyncio
import os
import sys

from stager.config import SourceConfig
from tests.daemon.support import REPO

from .test_metrics import scrape, value


async def status_table(node) -> tuple[int, str]:
    """``stager status`` as a person sees it (its tables, on stderr, wide enough not to wrap)."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}, "COLUMNS": "220"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "stager", "status", "--cache", str(node.work / "cache"), "--socket", str(node.socket),
        cwd=REPO, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode, err.decode()


async def test_floor_and_seconds_cross_the_socket_and_status_and_metrics_show_rate_and_ahead(node):
    m = node.corpus.manifest
    size = int(m.sizes[0])
    await node.start(metrics_address="127.0.0.1:0")
    session = node.session()
    dataset = await session.open_dataset(SourceConfig(node.proxy.url))
    window, floor = 8 * size, 2 * size
    plan = await session.plan(dataset, name="reader", window_bytes=window, floor_bytes=floor, ahead_seconds=0.01)
    daemon_plan = node.daemons[0].registry.plans()[0].plan
    assert (daemon_plan.window_bytes, daemon_plan.floor_bytes, daemon_plan.ahead_seconds) == (window, floor, 0.01)

    labels = {"consumer": session.consumer_id, "plan": "p0", "dataset": dataset.url}
    status, body = await node.raw("GET", "/v1/status")
    assert status == 200
    (shown,) = body["plans"]
    assert shown["rate"] is None and shown["ahead_bytes"] == window  # not measured yet: floor + first guess, capped
    before = await scrape(node)
    assert value(before, "stager_plan_ahead_bytes", **labels) == window
    assert ("stager_plan_consumer_rate_bytes_per_second", tuple(sorted(labels.items()))) not in before

    await plan.ready(0)
    await asyncio.sleep(1.1)  # the rate is measured over at least a second (its value is not asserted)
    await plan.advance(1)
    for _ in range(100):  # advances are sent on; bounded wait for the daemon to have it
        if daemon_plan.cursor == 1:
            break
        await asyncio.sleep(0.05)
    status, body = await node.raw("GET", "/v1/status")
    (shown,) = body["plans"]
    assert shown["rate"] > 0
    # 0.01 s of a consumer reading one shard in over a second is less than a shard past the floor
    assert floor <= shown["ahead_bytes"] < floor + size
    after = await scrape(node)
    assert value(after, "stager_plan_ahead_bytes", **labels) == shown["ahead_bytes"]
    assert value(after, "stager_plan_consumer_rate_bytes_per_second", **labels) > 0
    code, err = await status_table(node)
    assert code == 0, err
    assert "reads" in err and "stages ahead" in err and "MB/s" in err  # the plans' table, as a person reads it
    await plan.close()


async def test_a_bad_floor_or_seconds_is_refused_with_one_line_naming_it(node):
    await node.start()
    status, body = await node.raw("PUT", "/v1/consumers/c0/plans/p0",
                                  json={"dataset": {"url": node.proxy.url}, "ahead_seconds": -3})
    assert status == 400 and "ahead_seconds" in str(body)
    status, body = await node.raw("PUT", "/v1/consumers/c0/plans/p0",
                                  json={"dataset": {"url": node.proxy.url}, "floor_bytes": "lots"})
    assert status == 400 and "floor_bytes" in str(body)


async def test_a_daemon_of_an_earlier_version_gets_the_plan_without_the_fields_it_does_not_know(node, monkeypatch):
    """Daemons before time-bounded read-ahead refuse unknown plan fields; a newer consumer registers its plan
    without them there (such a daemon stages the whole window, which holds the floor)."""
    from stager.daemon import schema
    from stager.errors import DaemonRequestError

    current = schema.plan_request

    def earlier(body, *, local_sources):
        unknown = {"floor_bytes", "ahead_seconds"} & set(body)
        if unknown:  # the earlier daemon's own words
            raise DaemonRequestError(f"plan: unknown fields {sorted(unknown)}")
        return current(body, local_sources=local_sources)

    monkeypatch.setattr(schema, "plan_request", earlier)
    m = node.corpus.manifest
    await node.start()
    session = node.session()
    dataset = await session.open_dataset(SourceConfig(node.proxy.url))
    plan = await session.plan(dataset, name="reader", floor_bytes=int(m.sizes[0]), ahead_seconds=5.0)
    daemon_plan = node.daemons[0].registry.plans()[0].plan
    # as such a daemon does: the whole window
    assert daemon_plan.floor_bytes == daemon_plan.ahead_bytes == daemon_plan.window_bytes
    assert (await plan.ready(len(m) - 1)).read_bytes() == (node.corpus.root / m.paths[len(m) - 1]).read_bytes()
    await plan.close()
