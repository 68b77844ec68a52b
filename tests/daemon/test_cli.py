"""`stager stage` and `stager status` use the daemon when it serves their cache (real CLI processes)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from tests.daemon.support import REPO


async def stager(*args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "stager", *args, cwd=REPO, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode, out.decode(), err.decode()


async def test_stage_and_status_go_through_the_daemon(node):
    daemon = await node.start()
    m = node.corpus.manifest
    where = ["--cache", str(node.work / "cache"), "--capacity", str(node.capacity), "--socket", str(node.socket)]
    code, out, err = await stager("stage", node.proxy.url, *where, "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert (summary["blobs"], summary["bytes"], summary["fetched_bytes"], summary["failed"]) == \
        (len(m), m.total_bytes, m.total_bytes, 0)
    assert daemon.engine.stats.bytes_fetched == m.total_bytes, "the daemon did the fetching"
    assert daemon.engine.stats.blobs_completed == len(m)

    code, out, err = await stager("stage", node.proxy.url, *where, "--json")
    assert code == 0 and json.loads(out)["cached_bytes"] == m.total_bytes and json.loads(out)["fetched_bytes"] == 0

    code, out, err = await stager("status", *where, "--json")
    assert code == 0, err
    status = json.loads(out)
    assert status["daemon"]["pid"] == os.getpid() and status["complete_blobs"] == len(m)
    assert [d["complete"] for d in status["datasets"]] == [len(m)]
    fetch = status["daemon"]["fetch"]  # the adaptive concurrency, as the daemon's engine has it
    assert fetch["requests_in_flight"] == 0 and 1 <= fetch["concurrency"] <= fetch["concurrency_ceiling"]
    assert fetch["concurrency_peak"] >= fetch["concurrency"] and fetch["throughput_bps"] >= 0
    code, out, err = await stager("status", *where)
    assert code == 0 and f"daemon pid {os.getpid()} on {node.socket}" in out
    assert f"fetching: 0 requests in flight, limit {fetch['concurrency']} " in out


async def test_stage_through_the_daemon_keeps_its_exit_status_and_message(node):
    await node.start()
    missing = node.corpus.manifest.paths[5]
    (node.corpus.root / missing).unlink()
    code, out, err = await stager("stage", node.proxy.url, "--cache", str(node.work / "cache"), "--capacity",
                                  str(node.capacity), "--socket", str(node.socket))
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("stager: error: 1 of 8 shards could not be staged (first: ") and missing in last
