"""Staging 1 GiB+ from an S3-compatible origin: stager vs s5cmd, rclone and s3fs, side by side.

Each tool copies the same dataset from ``rclone serve s3`` on loopback to local
disk, first from a clean origin, then through the fault proxy without faults
(the baseline for the faulty phase: the proxy is a Python process on the same
cores and has a ceiling of its own), then through the fault proxy injecting
503 SlowDown, 500s, resets, truncated and corrupted bodies. For each: wall
time, MB/s, CPU seconds, peak RSS, whether the result verifies against the
manifest (xxh3-128 of every file), and the time until the copy is on the disk
(wall time plus the ``sync`` of the dirty pages it left: stager writes past the
page cache and fsyncs each shard before it counts as staged; the peers leave
their output in the page cache). stager verifies every block as it streams;
the peers' results are checked here, after the fact.

Every tool first runs once untimed; with ``--rounds N`` every tool then runs
N times per phase, each round starting with a different tool, and the run of
median wall time is reported.

With ``--grid``, instead: the origin-profile grid (stager.loopback.profiles),
one proxy per profile in front of the same server, in one run: loopback; 40 ms
+ 8 MB/s per connection; 100 ms + 2 MB/s per connection; SlowDown above 300
requests/s. At each, stager with its defaults beside s5cmd (defaults and
tuned) and rclone (tuned), every copy verified, and each tool's ratio to the
best verified peer. Here too every tool first runs once untimed (at loopback).

With ``--startup``, instead: the time from ``exec`` to the first request the
origin sees, and to the first request for a shard's bytes, for ``stager
stage`` and ``s5cmd cp`` (a TCP relay in front of the server notes when each
arrives; each tool is stopped once its first shard request is seen).

Run: ``make bench && .venv/bin/python benchmarks/stage.py [--gib 1] [--shard-mib 32] [--rounds 3] [--grid | --startup]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Run, machine, median_run, precompile_stager, s5cmd_binary, table, timed, tool  # noqa: E402

from stager.cache import BlobState, CacheTier  # noqa: E402
from stager.config import CacheConfig  # noqa: E402
from stager.testing import PROFILES, FaultPlan, FaultProxy, S3Server, object_store_plan  # noqa: E402
from stager.write import generate_corpus  # noqa: E402

FAULTS = FaultPlan(slowdown_p=0.03, error500_p=0.02, reset_p=0.02, truncate_p=0.02, flip_p=0.02,
                   path_regex=r"/corpus/shard-")
FAULT_FIELDS = ("slowdown_p", "error500_p", "reset_p", "truncate_p", "flip_p", "path_regex")


def file_digest(path: Path) -> str:
    hasher = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            hasher.update(chunk)
    return hasher.hexdigest()


def verify_folder(folder: Path, manifest) -> bool:
    try:
        return all(file_digest(folder / e.path) == e.digest for e in manifest)
    except OSError:
        return False


def verify_cache(cache_dir: Path, manifest) -> bool:
    with CacheTier(CacheConfig(cache_dir, capacity=1 << 40)) as cache:
        for entry in manifest:
            if cache.state(entry.digest) is not BlobState.COMPLETE:
                return False
            if file_digest(cache.complete_path(entry.digest)) != entry.digest:
                return False
    return True


def commands(endpoint: str, server: S3Server, work: Path, manifest, label: str) -> list[tuple[str, list[str], Path]]:
    """Each tool's name, command line and destination folder."""
    out = [("stager stage", [sys.executable, "-m", "stager", "stage", "s3://bench/corpus", "--cache",
                             str(work / f"{label}-stager"), "--capacity", str(manifest.total_bytes * 2),
                             "--concurrency", "16", "--json"], work / f"{label}-stager")]
    s5 = s5cmd_binary()
    if s5:
        dest = work / f"{label}-s5cmd"
        out.append(("s5cmd cp", [s5, "--endpoint-url", endpoint, "--numworkers", "32", "cp", "--concurrency", "4",
                                 "--part-size", "8", "s3://bench/corpus/*", f"{dest}/"], dest))
    rclone = tool("rclone")
    if rclone:
        dest = work / f"{label}-rclone"
        out.append(("rclone copy", [rclone, "copy", ":s3:bench/corpus", str(dest), "--s3-provider", "Other",
                                    "--s3-endpoint", endpoint, "--s3-access-key-id", server.access_key,
                                    "--s3-secret-access-key", server.secret_key, "--transfers", "16",
                                    "--multi-thread-streams", "4", "--exclude", ".stager/**"], dest))
    dest = work / f"{label}-s3fs"
    script = (f"import s3fs; fs = s3fs.S3FileSystem(key={server.access_key!r}, secret={server.secret_key!r}, "
              f"client_kwargs={{'endpoint_url': {endpoint!r}}}, "
              f"config_kwargs={{'response_checksum_validation': 'when_required'}}); "
              f"fs.get('bench/corpus/', {str(dest)!r} + '/', recursive=True)")
    out.append(("s3fs get", [sys.executable, "-c", script], dest))
    return out


def runs(endpoint: str, server: S3Server, work: Path, manifest, label: str, turn: int) -> list[tuple[Run, bool]]:
    """Every tool once, starting with tool number ``turn`` (so no tool is always the first to
    allocate the page cache it writes: on a virtual machine, memory the guest touches for the first
    time is slower to write), results in the usual order."""
    tools = commands(endpoint, server, work, manifest, label)
    env = server.env(endpoint)
    results: dict[str, tuple[Run, bool]] = {}
    for i in range(len(tools)):
        name, argv, dest = tools[(turn + i) % len(tools)]
        run = timed(name, argv, env, flush=True)
        check = verify_cache if name == "stager stage" else verify_folder
        results[name] = (run, run.returncode == 0 and check(dest, manifest))
        shutil.rmtree(dest, ignore_errors=True)
    return [results[name] for name, _, _ in tools]


def medians(rounds: list[list[tuple[Run, bool]]]) -> list[tuple[Run, bool]]:
    """Per tool, the run of median wall time; it verifies only if every round's result did."""
    out = []
    for i, (first, _) in enumerate(rounds[0]):
        runs_of_tool = [r[i] for r in rounds]
        out.append((median_run([run for run, _ in runs_of_tool]), all(ok for _, ok in runs_of_tool)))
    return out


def report(title: str, results: list[tuple[Run, bool]], nbytes: int, baseline: dict[str, float] | None,
           baseline_name: str = "clean run") -> dict[str, float]:
    peers = [(r, ok) for r, ok in results if r.name != "stager stage" and ok]
    fastest = min((r.seconds for r, _ in peers), default=None)
    fastest_on_disk = min((r.on_disk_seconds for r, _ in peers), default=None)
    rows = []
    for run, ok in results:
        ratio = f"{fastest / run.seconds:.2f}x" if fastest and ok else "-"
        ratio_on_disk = f"{fastest_on_disk / run.on_disk_seconds:.2f}x" if fastest_on_disk and ok else "-"
        vs_clean = f"{run.seconds / baseline[run.name]:.2f}x" if baseline and run.name in baseline else "-"
        rows.append([run.name, f"{run.seconds:.2f}", f"{nbytes / 1e6 / run.seconds:.0f}", f"{run.cpu_seconds:.1f}",
                     f"{run.peak_rss_mb:.0f}", "yes" if ok else f"NO (exit {run.returncode})", ratio,
                     f"{run.on_disk_seconds:.2f}", ratio_on_disk, vs_clean])
    print(f"\n## {title}\n")
    print(table(rows, ["tool", "wall s", "MB/s", "CPU s", "peak RSS MB", "verifies",
                       "speed vs fastest verified peer", "on disk s", "same, on disk",
                       f"time vs {baseline_name}"]))
    for run, _ in results:
        if run.name == "stager stage":
            try:
                summary = json.loads(run.stdout.strip().splitlines()[-1])
                print(f"\nstager's own account: {summary['seconds']:.2f} s staging after start-up, "
                      f"{summary['retries']} retries, {summary['hedged']} hedged requests, "
                      f"{summary['verify_failures']} blocks failing verification")
            except (ValueError, IndexError, KeyError):
                pass
    return {run.name: run.seconds for run, _ in results}


def grid_commands(endpoint: str, server: S3Server, work: Path, manifest) -> list[tuple[str, list[str], Path]]:
    """The grid's tools: stager and s5cmd with their defaults, s5cmd and rclone tuned."""
    out = [("stager stage (defaults)", [sys.executable, "-m", "stager", "stage", "s3://bench/corpus", "--cache",
                                        str(work / "grid-stager"), "--capacity", str(manifest.total_bytes * 2),
                                        "--json"], work / "grid-stager")]
    s5 = s5cmd_binary()
    if s5:
        out.append(("s5cmd (defaults)", [s5, "--endpoint-url", endpoint, "cp", "s3://bench/corpus/*",
                                         f"{work / 'grid-s5-defaults'}/"], work / "grid-s5-defaults"))
        out.append(("s5cmd (tuned)", [s5, "--endpoint-url", endpoint, "--numworkers", "32", "cp", "--concurrency",
                                      "4", "--part-size", "8", "s3://bench/corpus/*", f"{work / 'grid-s5-tuned'}/"],
                    work / "grid-s5-tuned"))
    rclone = tool("rclone")
    if rclone:
        dest = work / "grid-rclone"
        out.append(("rclone (tuned)", [rclone, "copy", ":s3:bench/corpus", str(dest), "--s3-provider", "Other",
                                       "--s3-endpoint", endpoint, "--s3-access-key-id", server.access_key,
                                       "--s3-secret-access-key", server.secret_key, "--transfers", "16",
                                       "--multi-thread-streams", "4", "--exclude", ".stager/**"], dest))
    return out


def warm_up(tools: list[tuple[str, list[str], Path]], env: dict[str, str]) -> None:
    """Run every tool once, untimed. On a machine that has just booted, the first run of all pays for what
    later ones do not (memory the host has not handed over yet, the disk's first writes, cold files): in
    a grid whose first round starts with stager, stager alone would pay it."""
    for _, argv, dest in tools:
        timed("warm-up", argv, env)
        shutil.rmtree(dest, ignore_errors=True)


def grid(server: S3Server, work: Path, manifest, rounds: int) -> None:
    """Every tool at every origin profile; a table per profile and one of stager's ratios to the best peer."""
    nbytes = manifest.total_bytes
    summary = []
    for index, (name, (description, _)) in enumerate(PROFILES.items()):
        plan = object_store_plan(name)
        with FaultProxy(server.endpoint_url, plan, seed=5, credentials=server.credentials) as proxy:
            # loopback goes straight to the server: the proxy is Python on the same cores, a ceiling of its own
            endpoint = proxy.url if plan != object_store_plan("loopback") else server.endpoint_url
            tools = grid_commands(endpoint, server, work, manifest)
            env = server.env(endpoint)
            per_round: list[list[tuple[Run, bool]]] = []
            if index == 0:  # as in the phases: an untimed first run of every tool (see warm_up)
                warm_up(tools, env)
            for r in range(rounds):
                results: dict[str, tuple[Run, bool]] = {}
                for i in range(len(tools)):
                    tool_name, argv, dest = tools[(r + i) % len(tools)]
                    run = timed(tool_name, argv, env, flush=True)
                    check = verify_cache if tool_name.startswith("stager") else verify_folder
                    results[tool_name] = (run, run.returncode == 0 and check(dest, manifest))
                    shutil.rmtree(dest, ignore_errors=True)
                per_round.append([results[t] for t, _, _ in tools])
            results_median = medians(per_round)
            faults = proxy.faults
        peers = [run.seconds for run, ok in results_median if ok and not run.name.startswith("stager")]
        best = min(peers, default=None)
        rows = []
        for run, ok in results_median:
            ratio = f"{best / run.seconds:.2f}x" if best and ok else "-"
            rows.append([run.name, f"{run.seconds:.2f}", f"{nbytes / 1e6 / run.seconds:.0f}",
                         f"{run.cpu_seconds:.1f}", f"{run.peak_rss_mb:.0f}", "yes" if ok else f"NO (exit {run.returncode})",
                         ratio])
            if run.name.startswith("stager"):
                summary.append([name, description, f"{run.seconds:.2f}", f"{best:.2f}" if best else "-", ratio,
                                f"{run.peak_rss_mb:.0f}", "yes" if ok else "NO"])
                _stager_account(run)
        print(f"\n## profile {name}: {description}\n")
        print(table(rows, ["tool", "wall s", "MB/s", "CPU s", "peak RSS MB", "verifies", "speed vs best peer"]))
        if faults:
            print(f"\nproxy answers: {json.dumps(faults)}")
    print("\n## stager defaults vs the best peer, per profile\n")
    print(table(summary, ["profile", "origin", "stager s", "best peer s", "ratio", "stager peak RSS MB",
                          "verifies"]))


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system, every thread) process ``pid`` has used so far; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


class FirstRequests:
    """A TCP relay in front of ``upstream`` (host, port) noting the wall time of the first request and of
    the first one naming ``marker`` in its request line (the bytes pass unchanged)."""

    def __init__(self, upstream: tuple[str, int], marker: bytes) -> None:
        self.upstream = upstream
        self.marker = marker
        self.pid = 0  # the client whose CPU seconds are noted with each time (on a loaded machine, the steadier figure)
        self.first: float | None = None
        self.first_marked: float | None = None
        self.cpu_first = self.cpu_marked = 0.0
        self.seen = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while chunk := src.recv(1 << 16):
                if requests:
                    now = time.time()
                    if self.first is None:
                        self.first, self.cpu_first = now, cpu_seconds(self.pid)
                    if self.first_marked is None and self.marker in chunk:
                        self.first_marked, self.cpu_marked = now, cpu_seconds(self.pid)
                        self.seen.set()
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._listener.close()


def startup(server: S3Server, work: Path, manifest, rounds: int, latency: float) -> None:
    """Exec to the first request, and to the first shard request, for stager stage and s5cmd (median of
    rounds); with ``latency``, through a proxy that waits that long before each response."""
    if latency:
        with FaultProxy(server.endpoint_url, FaultPlan(latency_s=latency), credentials=server.credentials) as proxy:
            return _startup(proxy.url, server, work, manifest, rounds, f"{latency * 1000:.0f} ms before each response")
    return _startup(server.endpoint_url, server, work, manifest, rounds, "loopback")


def _startup(upstream: str, server: S3Server, work: Path, manifest, rounds: int, origin: str) -> None:
    host, port = upstream.split("//", 1)[1].split(":")
    names = ("stager stage", "s5cmd cp")
    figures: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in names}
    for r in range(rounds + 1):  # the first round is untimed (the disk's and the page cache's warm-up)
        for name in names:
            # a relay of its own for each run: a killed run's connections still queued are not counted
            relay = FirstRequests((host, int(port)), b"/corpus/shard-")
            try:
                tools = {n: (argv, dest) for n, argv, dest in commands(relay.url, server, work, manifest, "startup")}
                if name not in tools:
                    continue
                argv, dest = tools[name]
                os.sync()
                began = time.time()
                proc = subprocess.Popen(argv, env={**os.environ, **server.env(relay.url)},
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                relay.pid = proc.pid
                relay.seen.wait(60)
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                shutil.rmtree(dest, ignore_errors=True)
                if r and relay.first is not None and relay.first_marked is not None:
                    figures[name].append((relay.first - began, relay.first_marked - began, relay.cpu_first,
                                          relay.cpu_marked))
            finally:
                relay.close()
    tools = [(n, argv, dest) for n, argv, dest in commands(upstream, server, work, manifest, "startup") if n in names]
    rows = []
    for name, argv, _ in tools:
        noted = figures[name]
        if not noted:
            rows.append([name, "-", "-", "-", "-"])
            continue
        rows.append([name, *(f"{sorted(n[k] for n in noted)[len(noted) // 2]:.3f}" for k in range(4))])
    print(f"\n## start-up: exec to the origin's first request ({origin}; median of {rounds}; load average "
          f"{os.getloadavg()[0]:.1f})\n")
    print(table(rows, ["tool", "start-up to first request s", "to first shard request s", "CPU s to first request",
                       "CPU s to first shard request"]))
    print("\ncommands:")
    for name, argv, _ in tools:
        print(f"  {name}: {' '.join(argv)}")


def _stager_account(run: Run) -> None:
    try:
        summary = json.loads(run.stdout.strip().splitlines()[-1])
        print(f"stager's own account: {summary['seconds']:.2f} s staging after start-up, "
              f"{summary['retries']} retries, adaptive limit up to {summary.get('concurrency_peak', '?')} requests in flight")
    except (ValueError, IndexError, KeyError):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="dataset size in GiB")
    parser.add_argument("--shard-mib", type=float, default=32, help="shard size in MiB (0.25: 256 KiB shards)")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp dir)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each tool per phase; the median is reported")
    parser.add_argument("--grid", action="store_true", help="run the origin-profile grid instead of the phases")
    parser.add_argument("--startup", action="store_true", help="measure only the start-up to the first request")
    parser.add_argument("--latency", type=float, default=0.0, help="with --startup: seconds before each response")
    args = parser.parse_args()
    precompile_stager()
    work = Path(args.work or tempfile.mkdtemp(prefix="stager-bench-"))
    shards = max(1, int(args.gib * 1024 / args.shard_mib))
    print(f"# stage benchmark: {shards} shards x {args.shard_mib} MiB from rclone serve s3 on loopback")
    print(f"machine: {machine()}")
    print(f"reproduce: .venv/bin/python benchmarks/stage.py --gib {args.gib} --shard-mib {args.shard_mib} "
          f"--rounds {args.rounds}" + (" --grid" if args.grid else "") + (" --startup" if args.startup else "")
          + (f" --latency {args.latency}" if args.latency else ""))
    manifest = generate_corpus(work / "s3" / "bench" / "corpus", shards=shards,
                               tokens_per_shard=int(args.shard_mib * (1 << 19)), jitter=0.0, seed=1)
    nbytes = manifest.total_bytes
    # The bucket does not change during a run: the server may keep its listing. Without that, `rclone serve s3`
    # lists the folder at every GET, and with thousands of small shards it was the bottleneck of every tool.
    server = S3Server(work / "s3", etag_hash="", extra_args=("--dir-cache-time", "1h"))
    try:
        if args.grid:
            grid(server, work, manifest, args.rounds)
            return
        if args.startup:
            startup(server, work, manifest, args.rounds, args.latency)
            return
        runs(server.endpoint_url, server, work, manifest, "warm-up", 0)  # untimed: see runs()
        clean = medians([runs(server.endpoint_url, server, work, manifest, "clean", r) for r in range(args.rounds)])
        baseline = report("clean origin", clean, nbytes, None)
        with FaultProxy(server.endpoint_url, seed=11, credentials=server.credentials) as proxy:
            proxied = medians([runs(proxy.url, server, work, manifest, "proxied", r) for r in range(args.rounds)])
            proxied_baseline = report("through the fault proxy, no faults (the baseline of the next phase)",
                                      proxied, nbytes, baseline)
            proxy.update(**{name: getattr(FAULTS, name) for name in FAULT_FIELDS})
            faulty = medians([runs(proxy.url, server, work, manifest, "faulty", r) for r in range(args.rounds)])
            print(f"\nfaults injected: {json.dumps(proxy.faults)}")
        report("through the fault proxy (503, 500, resets, truncated and flipped bodies)", faulty, nbytes,
               proxied_baseline, "the proxy without faults")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
