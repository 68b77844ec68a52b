"""N nodes staging one dataset through one capped uplink: stager's cluster cache vs N independent s5cmd copies.

The origin is `rclone serve s3` on loopback behind the fault proxy, whose
``bandwidth_bps`` caps the bytes of every GET together: the shared uplink of
a cluster to its object store. For N = 1, 2, 4: N `stager serve` daemons (one
per loopback address 127.0.0.2.., each with its own cache, members of one
cluster) and N `stager stage` runs at once, one per daemon; then N `s5cmd cp`
copies at once through the same cap. Printed per N: origin bytes / dataset,
seconds until every node holds the dataset, and that time over the N = 1
time. The cluster's target: origin bytes <= 1.05x and time within 1.3x of
one node's at every N; the s5cmd copies take about N times as long.

    .venv/bin/python benchmarks/peers.py --mib 256 --cap-mbps 40
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine, precompile_stager, s5cmd_binary, table  # noqa: E402

from stager.daemon import probe  # noqa: E402
from stager.testing import FaultPlan, FaultProxy, S3Server  # noqa: E402
from stager.testing.s3server import free_port  # noqa: E402
from stager.write import generate_corpus  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def env(server: S3Server, endpoint: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), out.get("PYTHONPATH")]))
    return {**out, **server.env(endpoint)}


def wait_ready(socket: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"a daemon exited with {proc.returncode}")
        health = probe(socket, timeout=1.0)
        if health is not None and health.get("pid") == proc.pid:
            return
        time.sleep(0.1)
    raise SystemExit(f"the daemon on {socket} did not answer in {timeout}s")


def wait_formed(socket: Path, n: int, timeout: float = 60.0) -> None:
    """Until the daemon on ``socket`` counts ``n`` members live (its health checks run every 2 s)."""
    async def live() -> int:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(socket))) as client:
            async with client.get("http://stager/v1/status", timeout=aiohttp.ClientTimeout(total=10)) as r:
                return len((await r.json())["cluster"]["live"])

    deadline = time.monotonic() + timeout
    while asyncio.run(live()) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"the daemon on {socket} did not see {n} live members in {timeout}s")
        time.sleep(0.2)


def cluster_run(n: int, server: S3Server, proxy: FaultProxy, work: Path, nbytes: int) -> tuple[float, float]:
    """(seconds until all N nodes hold the dataset, origin bytes / dataset)."""
    secret = work / "secret"
    secret.write_text(secrets.token_hex(32))
    nodes = []
    for i in range(n):
        host = f"127.0.0.{2 + i}"
        folder = Path(tempfile.mkdtemp(prefix="stg-"))  # short (it holds a Unix socket): not under --work
        nodes.append((host, free_port(host), folder))
    spec = ",".join(f"{h}:{p}" for h, p, _ in nodes)
    daemons = []
    try:
        for host, port, folder in nodes:
            argv = [sys.executable, "-m", "stager", "serve", "--socket", str(folder / "d.sock"), "--cache",
                    str(folder / "cache"), "--capacity", str(nbytes * 2), "--concurrency", "16"]
            if n > 1:
                argv += ["--peer-listen", f"{host}:{port}", "--peers", spec, "--peer-secret-file", str(secret)]
            log = open(folder / "log", "wb")
            daemons.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env(server, proxy.url),
                                            cwd=REPO))
        for (_, _, folder), proc in zip(nodes, daemons):
            wait_ready(folder / "d.sock", proc)
        if n > 1:
            for _, _, folder in nodes:
                wait_formed(folder / "d.sock", n)
        before = proxy.bytes_forwarded
        began = time.monotonic()
        stages = [subprocess.Popen([sys.executable, "-m", "stager", "stage", "s3://bench/corpus", "--cache",
                                    str(folder / "cache"), "--socket", str(folder / "d.sock"), "--json", "-o",
                                    f"endpoint_url={proxy.url}", "-o", f"key={server.access_key}", "-o",
                                    f"secret={server.secret_key}"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, env=env(server, proxy.url), cwd=REPO)
                  for _, _, folder in nodes]
        for proc in stages:
            _, err = proc.communicate(timeout=3600)
            if proc.returncode != 0:
                raise SystemExit(f"stager stage failed: {err.decode()[-2000:]}")
        seconds = time.monotonic() - began
        return seconds, (proxy.bytes_forwarded - before) / nbytes
    finally:
        for proc in daemons:
            proc.terminate()
        for proc in daemons:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for _, _, folder in nodes:
            shutil.rmtree(folder, ignore_errors=True)


def s5cmd_run(n: int, server: S3Server, proxy: FaultProxy, work: Path, nbytes: int) -> tuple[float, float] | None:
    s5 = s5cmd_binary()
    if s5 is None:
        return None
    before = proxy.bytes_forwarded
    began = time.monotonic()
    procs = [subprocess.Popen([s5, "--endpoint-url", proxy.url, "cp", "s3://bench/corpus/*", f"{work}/s5-{i}/"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env(server, proxy.url))
             for i in range(n)]
    for proc in procs:
        _, err = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(f"s5cmd failed: {err.decode()[-2000:]}")
    seconds = time.monotonic() - began
    for i in range(n):
        shutil.rmtree(work / f"s5-{i}", ignore_errors=True)
    return seconds, (proxy.bytes_forwarded - before) / nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="dataset size")
    parser.add_argument("--shard-mib", type=int, default=16)
    parser.add_argument("--cap-mbps", type=float, default=40.0, help="the origin's total egress, MB/s")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--work", default=None)
    args = parser.parse_args()
    precompile_stager()
    work = Path(args.work or tempfile.mkdtemp(prefix="stager-bench-"))
    shards = max(1, args.mib // args.shard_mib)
    manifest = generate_corpus(work / "s3" / "bench" / "corpus", shards=shards,
                               tokens_per_shard=args.shard_mib << 19, jitter=0.0, seed=3)
    nbytes = manifest.total_bytes
    print(f"# peers benchmark: {shards} shards x {args.shard_mib} MiB, origin egress capped at "
          f"{args.cap_mbps:g} MB/s in all")
    print(f"machine: {machine()}")
    print("command: .venv/bin/python benchmarks/peers.py " + " ".join(sys.argv[1:]))
    server = S3Server(work / "s3", etag_hash="")
    rows = []
    try:
        plan = FaultPlan(bandwidth_bps=args.cap_mbps * 1e6, path_regex=r"/corpus/shard-")
        with FaultProxy(server.endpoint_url, plan, credentials=server.credentials) as proxy:
            one_cluster = one_s5 = None
            for n in args.nodes:
                c_seconds, c_ratio = cluster_run(n, server, proxy, work, nbytes)
                s5 = s5cmd_run(n, server, proxy, work, nbytes)
                one_cluster = one_cluster or c_seconds
                one_s5 = one_s5 or (s5[0] if s5 else None)
                rows.append([n, f"{c_ratio:.3f}", f"{c_seconds:.1f}", f"{c_seconds / one_cluster:.2f}",
                             f"{s5[1]:.3f}" if s5 else "-", f"{s5[0]:.1f}" if s5 else "-",
                             f"{s5[0] / one_s5:.2f}" if s5 and one_s5 else "-"])
                print(table(rows[-1:], ["N", "stager origin/dataset", "stager s", "stager vs N=1",
                                        "s5cmd origin/dataset", "s5cmd s", "s5cmd vs N=1"]), flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(rows, ["N", "stager origin/dataset", "stager s", "stager vs N=1", "s5cmd origin/dataset",
                       "s5cmd s", "s5cmd vs N=1"]))


if __name__ == "__main__":
    main()
