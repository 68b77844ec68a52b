"""The real ``stager replicate`` command killed with SIGKILL again and again, then run to the end."""

from __future__ import annotations

import json
import random
import signal
import time

from stager.loopback.fault_plan import FaultPlan
from tests.cli.runner import run, start

from .dataset import MiB, assert_replica, flags, mixed_files, write_dataset

#: What one run may hold in flight: one part. A kill can cost at most this much uploaded again.
BUFFER = 5 * MiB


def replicate_args(a, b, dst_endpoint: str, state, *extra: str) -> list[str]:
    return ["replicate", a.url("ds"), b.url("copy"), *flags("-s", a.options()),
            *flags("-d", b.options(dst_endpoint)), "--state-dir", str(state), "--buffer", f"{BUFFER}",
            "--part-size", "5MiB", "--concurrency", "4", "--retry-deadline", "60", "--json", *extra]


def test_sigkill_loop_resends_at_most_what_was_in_flight(clusters, fault_proxy, tmp_path):
    a, b = clusters
    files = mixed_files(seed=9, large=(21 * MiB + 5, 14 * MiB + 777, 11 * MiB), small=80)
    manifest = write_dataset(a.root / "ds", files)
    # No faults: the proxy only counts the request bodies the destination receives.
    proxy = fault_proxy(b.server, FaultPlan(methods=()))
    args = replicate_args(a, b, proxy.url, tmp_path / "state")
    rng = random.Random(20261129)
    kills = 0
    for _ in range(14):
        before = proxy.stats().bytes_up
        # Kill once this much more has been sent: after a part or so, mid-part, mid-object.
        threshold = rng.uniform(0.8, 1.6) * BUFFER
        proc = start(args)
        deadline = time.monotonic() + 60
        while proc.poll() is None and proxy.stats().bytes_up - before < threshold and time.monotonic() < deadline:
            time.sleep(0.005)
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        kills += 1
    assert kills >= 10, f"the copy finished after {kills} kills: make the dataset larger"
    result = run(args, timeout=180)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["failed"] == 0 and summary["complete"]
    assert summary["copied_bytes"] < manifest.total_bytes / 2, "the killed runs made no lasting progress"
    assert_replica(a.root / "ds", b.root / "copy")

    sent = proxy.stats().bytes_up
    overhead = 64 * 1024  # CompleteMultipartUpload XML, the manifest, a few small writes of nothing
    resent = sent - manifest.total_bytes - len((a.root / "ds" / ".stager" / "manifest.parquet").read_bytes())
    assert resent <= kills * BUFFER + overhead, (
        f"{resent:,} bytes sent again after {kills} kills: more than {kills} x {BUFFER:,} in flight")

    again = run(args, timeout=60)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["copied_bytes"] == 0
    assert proxy.stats().bytes_up == sent, "a run with nothing to do sent bytes"


#: Parts the resume test lets one run hold at once (its --concurrency): each is one ranged read.
HELD = 3
PART = 5 * MiB


def test_a_run_killed_mid_copy_reads_again_at_most_the_parts_it_held(clusters, fault_proxy, tmp_path):
    a, b = clusters
    rng = random.Random(15)
    files = {f"large/obj-{i}.bin": rng.randbytes(3 * PART) for i in range(8)}
    manifest = write_dataset(a.root / "ds", files)
    manifest_bytes = len((a.root / "ds" / ".stager" / "manifest.parquet").read_bytes())
    # No faults: the proxy in front of the source only counts the bytes it serves.
    proxy = fault_proxy(a.server, FaultPlan(methods=()))
    # The default byte budget (128 MiB) would hold the whole dataset; the parts held are what bounds a kill's cost.
    args = ["replicate", a.url("ds"), b.url("copy"), *flags("-s", a.options(proxy.url)), *flags("-d", b.options()),
            "--state-dir", str(tmp_path / "state"), "--part-size", "5MiB", "--concurrency", str(HELD),
            "--retry-deadline", "60", "--json"]
    proc = start(args)
    deadline = time.monotonic() + 120
    while proc.poll() is None and proxy.stats().bytes_down < 0.4 * manifest.total_bytes and time.monotonic() < deadline:
        time.sleep(0.005)
    assert proc.poll() is None, "the copy ended before 40% of it was read"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)

    result = run(args, timeout=180)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["failed"] == 0
    assert_replica(a.root / "ds", b.root / "copy")
    read_twice = proxy.stats().bytes_down - manifest.total_bytes - 2 * manifest_bytes
    overhead = 64 * 1024  # listings
    assert read_twice <= HELD * PART + overhead, (
        f"{read_twice:,} bytes read again after one kill: more than the {HELD} parts of {PART:,} a run may hold")
