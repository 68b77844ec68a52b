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

Beside each cluster run, the CPU seconds its parts used while staging (the
daemons, the `stager stage` processes, this process, which runs the proxy,
and rclone) and their sum over the machine's capacity in that time (cores x
seconds): near 100%, the run is bound by the CPU of this machine, not by the
capped link, and its time says nothing about the cluster's spreading.

    .venv/bin/python benchmarks/peers.py --mib 256 --cap-mbps 40
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
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

from stager.daemon_client import probe  # noqa: E402
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


def daemon_status(socket: Path) -> dict:
    """The daemon's status (``/v1/status``): its engine's counters, its view of the cluster."""
    async def ask() -> dict:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(socket))) as client:
            async with client.get("http://stager/v1/status", timeout=aiohttp.ClientTimeout(total=10)) as r:
                return await r.json()

    return asyncio.run(ask())


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


def cpu_of(pid: int | None) -> float:
    """CPU seconds (user + system) a live process has used so far; 0 if it is gone."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_wait_of(pid: int | None) -> float:
    """Seconds the threads of a live process have spent runnable but waiting for a CPU (schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("*") if pid is not None else ():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            pass  # the thread ended
    return total / 1e9


def children_cpu() -> float:
    """CPU seconds of this process's reaped children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cluster_run(n: int, server: S3Server, proxy: FaultProxy, work: Path, nbytes: int) -> tuple[float, float, dict]:
    """(seconds until all N nodes hold the dataset, origin bytes / dataset, CPU seconds by part while staging)."""
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
        cpu_before = ([cpu_of(p.pid) for p in daemons], children_cpu(), time.process_time(), cpu_of(server.pid),
                      [cpu_wait_of(p.pid) for p in daemons])
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
        cpu = {"daemons": sum(cpu_of(p.pid) - c for p, c in zip(daemons, cpu_before[0])),
               "stages": children_cpu() - cpu_before[1], "proxy": time.process_time() - cpu_before[2],
               "rclone": cpu_of(server.pid) - cpu_before[3]}
        cpu["share"] = sum(cpu.values()) / ((os.cpu_count() or 1) * seconds)
        cpu["daemons_waiting"] = sum(cpu_wait_of(p.pid) - w for p, w in zip(daemons, cpu_before[4]))
        # What sends a shard to the origin twice: a hedged origin request, a peer failure, a member seen down.
        for host, _, folder in nodes:
            status = daemon_status(folder / "d.sock")
            engine, cluster = status["engine"], status.get("cluster") or {}
            failures = {k: v for k, v in cluster.get("peer_failures", {}).items() if v}
            downs = [line for line in (folder / "log").read_text(errors="replace").splitlines()
                     if "is down (" in line or "answers again" in line]
            print(f"  {host}: from the origin {engine['bytes_from_origin'] / nbytes:.3f} of the dataset, hedged "
                  f"{engine['hedged_requests']} (won {engine['hedges_won']}); peer failures {failures or 'none'}; "
                  f"membership changes seen: {len(downs)}", flush=True)
            for line in downs:
                print(f"    {line}", flush=True)
        return seconds, (proxy.bytes_forwarded - before) / nbytes, cpu
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
                c_seconds, c_ratio, cpu = cluster_run(n, server, proxy, work, nbytes)
                print(f"N={n} CPU seconds while staging: daemons {cpu['daemons']:.1f}, stage runs "
                      f"{cpu['stages']:.1f}, proxy (this process) {cpu['proxy']:.1f}, rclone {cpu['rclone']:.1f}; "
                      f"{cpu['share']:.0%} of the machine's {os.cpu_count()} cores over {c_seconds:.1f} s; "
                      f"the daemons' threads waited {cpu['daemons_waiting']:.1f} s for a CPU; "
                      f"load average {os.getloadavg()[0]:.1f}", flush=True)
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
