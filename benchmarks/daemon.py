"""8 consumer processes through one node daemon vs 8 embedded engines on the same cache, side by side.

The node's situation: eight ranks read the same dataset (here each in its own
order, so their plans overlap but do not march in step). Two runs on a cold
cache each, against the same origin (an HTTP server behind the fault proxy
with a latency and a bandwidth cap, whose byte counter is the ground truth):

* daemon: ``stager serve`` runs; the 8 consumers use ``open_session(mode="daemon")``;
* embedded: no daemon; the 8 consumers each run an engine (``mode="embedded"``)
  on the same cache directory (which already keeps them from fetching a blob twice at once).

For each: origin bytes (target: the dataset once), total time consumers spent
blocked waiting for data, wall time, and CPU seconds and peak RSS: of the
daemon process, of the consumer processes, and of the node as a whole.

Run: ``.venv/bin/python benchmarks/daemon.py [--shards 32] [--shard-mib 8] [--consumers 8] [--origin-mbps 400]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine, precompile_stager, table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


# -- the consumer (this file run with --consumer) ---------------------------------------------------


async def consume(args: argparse.Namespace) -> dict:
    from stager.config import CacheConfig, FetchConfig, SourceConfig
    from stager.session import open_session

    # Start together: eight interpreters importing at once on a small machine would otherwise
    # starve whoever stages first (the daemon), and the import storm is not what is measured.
    print("ready", flush=True)
    sys.stdin.readline()
    session = open_session(CacheConfig(directory=args.cache, capacity=args.capacity), FetchConfig(),
                           socket=args.socket, mode=args.mode)
    order = [int(i) for i in args.order.split(",")]
    waited = 0.0
    nbytes = 0
    async with session:
        dataset = await session.open_dataset(SourceConfig(args.source))
        plan = await session.plan(dataset, order)
        loop = asyncio.get_running_loop()
        for position in range(len(order)):
            began = time.monotonic()
            path = await plan.ready(position)
            waited += time.monotonic() - began
            nbytes += len(await loop.run_in_executor(None, path.read_bytes))  # the training step reads it
            await plan.advance(position + 1)
        await plan.close()
        kind = getattr(session, "mode", "embedded")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"waited": waited, "bytes": nbytes, "mode": kind, "cpu": usage.ru_utime + usage.ru_stime,
            "rss_mb": usage.ru_maxrss / 1024}


# -- the runs ----------------------------------------------------------------------------------------


class Sampler:
    """Peak RSS and CPU of one process, sampled every 50 ms."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.process = psutil.Process(pid)
        self.peak_rss = 0
        self.cpu = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(0.05):
            try:
                self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)
                times = self.process.cpu_times()
                self.cpu = times.user + times.system
            except psutil.Error:
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), e.get("PYTHONPATH")]))
    return e


def wait_for_socket(socket: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    from stager.daemon_client import probe

    deadline = time.monotonic() + timeout
    while probe(socket) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the daemon did not start (exit {proc.poll()})")
        time.sleep(0.05)


def run(mode: str, args, source: str, proxy, work: Path, orders: list[list[int]], capacity: int) -> dict:
    cache = work / f"cache-{mode}"
    cache.mkdir()
    socket = work / f"{mode}.sock"
    daemon = sampler = None
    before = proxy.stats().bytes_down
    if mode == "daemon":
        daemon = subprocess.Popen([sys.executable, "-m", "stager", "serve", "--socket", str(socket),
                                   "--cache", str(cache), "--capacity", str(capacity),
                                   "--concurrency", str(args.daemon_concurrency)],
                                  env=env(), cwd=REPO,
                                  stdout=subprocess.DEVNULL, stderr=open(work / "daemon.log", "wb"))
        wait_for_socket(socket, daemon)
        if args.daemon_nice:
            os.setpriority(os.PRIO_PROCESS, daemon.pid, args.daemon_nice)
        sampler = Sampler(daemon.pid)
    consumers = [subprocess.Popen([sys.executable, __file__, "--consumer", "--cache", str(cache), "--capacity",
                                   str(capacity), "--socket", str(socket), "--mode", mode, "--source", source,
                                   "--order", ",".join(map(str, order))],
                                  env=env(), cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
                 for order in orders]
    for proc in consumers:
        if proc.stdout.readline().strip() != b"ready":
            raise SystemExit(f"a consumer did not start:\n{proc.stderr.read().decode()[-3000:]}")
    began = time.monotonic()
    for proc in consumers:
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
    results = []
    for proc in consumers:
        out, err = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"a consumer failed:\n{err.decode()[-3000:]}")
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    wall = time.monotonic() - began
    row = {"mode": mode, "wall": wall, "origin_bytes": proxy.stats().bytes_down - before,
           "waited": sum(r["waited"] for r in results), "consumer_cpu": sum(r["cpu"] for r in results),
           "consumer_rss_mb": max(r["rss_mb"] for r in results), "modes": {r["mode"] for r in results},
           "read_bytes": sum(r["bytes"] for r in results)}
    if daemon is not None:
        assert sampler is not None
        sampler.stop()
        row["daemon_cpu"], row["daemon_rss_mb"] = sampler.cpu, sampler.peak_rss / 2**20
        daemon.terminate()
        daemon.wait(60)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--consumer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--capacity", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--order", help=argparse.SUPPRESS)
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--shard-mib", type=int, default=8)
    parser.add_argument("--consumers", type=int, default=8)
    parser.add_argument("--origin-mbps", type=float, default=400.0, help="origin bandwidth cap, MB/s")
    parser.add_argument("--latency-ms", type=float, default=5.0, help="origin latency per request")
    parser.add_argument("--daemon-concurrency", type=int, default=16,
                        help="the daemon's block requests in flight (each embedded engine has the default 16)")
    parser.add_argument("--daemon-nice", type=int, default=0,
                        help="scheduling priority of the daemon (negative: higher; needs root). On a shared, "
                             "loaded machine one daemon process gets one scheduler share against 8 engines' 8")
    args = parser.parse_args()
    precompile_stager()
    if args.consumer:
        print(json.dumps(asyncio.run(consume(args))))
        return

    from stager.testing import FaultPlan, FaultProxy, HttpOrigin
    from stager.write import generate_corpus

    work = Path(tempfile.mkdtemp(prefix="stg-bench-", dir="/tmp"))
    try:
        manifest = generate_corpus(work / "corpus", shards=args.shards, tokens_per_shard=args.shard_mib * 2**19,
                                   seed=0, block_size=1 << 20)
        total = manifest.total_bytes
        n = len(manifest)
        orders = [[(k * n // args.consumers + j) % n for j in range(n)] for k in range(args.consumers)]
        capacity = 4 * total
        plan = FaultPlan(latency_s=args.latency_ms / 1000, bandwidth_bps=args.origin_mbps * 1e6)
        with HttpOrigin(work / "corpus") as origin, FaultProxy(origin.url, plan) as proxy:
            rows = [run(mode, args, proxy.url, proxy, work, orders, capacity) for mode in ("daemon", "embedded")]
    finally:
        shutil.rmtree(work, ignore_errors=True)

    d, e = rows
    manifest_bytes = d["origin_bytes"] - total  # the rest is manifests (each consumer and the daemon read one)
    print(f"# {args.consumers} consumers, each reading all {n} shards of {args.shard_mib} MiB "
          f"({total / 2**20:.0f} MiB) in its own order; origin {args.origin_mbps:.0f} MB/s, "
          f"{args.latency_ms:.0f} ms; {machine()}\n")
    print(table([
        [r["mode"], f"{r['origin_bytes'] / 2**20:.1f}", f"{r['origin_bytes'] / total:.3f}", f"{r['waited']:.1f}",
         f"{r['wall']:.1f}", f"{r.get('daemon_cpu', 0.0):.1f}" if r["mode"] == "daemon" else "-",
         f"{r.get('daemon_rss_mb', 0.0):.0f}" if r["mode"] == "daemon" else "-",
         f"{r['consumer_cpu']:.1f}", f"{r['consumer_rss_mb']:.0f}"]
        for r in rows],
        ["mode", "origin MiB", "x dataset", "wait s (sum)", "wall s", "daemon CPU s", "daemon RSS MB",
         "consumers CPU s", "consumer RSS MB (max)"]))
    print()
    k = args.consumers
    node_cpu_d, node_cpu_e = d["daemon_cpu"] + d["consumer_cpu"], e["consumer_cpu"]
    node_rss_d, node_rss_e = d["daemon_rss_mb"] + k * d["consumer_rss_mb"], k * e["consumer_rss_mb"]
    print(f"origin bytes / dataset: daemon {d['origin_bytes'] / total:.3f}, embedded {e['origin_bytes'] / total:.3f} "
          f"(the excess is manifest reads: {manifest_bytes / 2**10:.0f} KiB in the daemon run)")
    print(f"consumer wait (sum over {k}), embedded / daemon: {e['waited'] / max(d['waited'], 1e-9):.2f}")
    print(f"wall time, embedded / daemon: {e['wall'] / d['wall']:.2f}")
    print(f"node CPU seconds (every process), embedded / daemon run: {node_cpu_e / node_cpu_d:.2f} "
          f"({node_cpu_e:.1f} vs {node_cpu_d:.1f})")
    print(f"node memory (sum of peak RSS), embedded / daemon run: {node_rss_e / node_rss_d:.2f} "
          f"({node_rss_e:.0f} vs {node_rss_d:.0f} MB; a consumer without an engine peaks at "
          f"{d['consumer_rss_mb']:.0f} MB, with one at {e['consumer_rss_mb']:.0f} MB)")
    print(f"daemon peak RSS {d['daemon_rss_mb']:.0f} MB "
          f"({'under' if d['daemon_rss_mb'] < 300 else 'OVER'} the 300 MB target), CPU {d['daemon_cpu']:.1f} s")
    print(f"\nreproduce: .venv/bin/python benchmarks/daemon.py --shards {args.shards} --shard-mib {args.shard_mib} "
          f"--consumers {args.consumers} --origin-mbps {args.origin_mbps:g} --latency-ms {args.latency_ms:g} "
          f"--daemon-concurrency {args.daemon_concurrency} --daemon-nice {args.daemon_nice}")


if __name__ == "__main__":
    main()
