"""Replicating S3 to S3 between two servers: stager vs rclone copy vs s5cmd, side by side.

Two ``rclone serve s3`` servers on loopback, with different keys, play two
clusters. Each tool copies the same datasets from one to the other:

- ``large``: 1 GiB+ in 64 MiB objects (multipart uploads);
- ``small``: 10,000 small objects (4-32 KiB);

first between clean servers, then through a fault proxy in front of each
(GETs: 503 SlowDown, 500, resets, truncated and corrupted bodies; PUTs and
POSTs: 503, 500, resets). Every copy is then checked against the source
manifest (xxh3-128 of every object, read from the destination server's disk):
stager verifies every block in flight; the peers are checked here, after the
fact. s5cmd cannot copy between two endpoints with different keys, so it runs
as it can: download to local disk, then upload (two commands, a full local
copy; their times are added).

Last, stager's peak RSS on 10,000 vs 100,000 tiny objects, which should not
grow with the object count (the plan lives in sqlite on disk).

With ``--grid``, instead: the origin-profile grid. 1 GiB in 32 MiB objects
copied with each tool's defaults or tuning, the source behind each profile of
``stager.loopback.profiles`` in turn (loopback; 40 ms and 8 MB/s per
connection; 100 ms and 2 MB/s per connection; SlowDown above 300 requests/s),
the destination straight; every copy verified; stager's ratio to the best
peer per profile.

With ``--resume``, instead: the waste of a resumed copy. stager and rclone
each copy 1 GiB in 32 MiB objects through a proxy in front of the source that
counts the bytes it forwards; each is killed (SIGKILL) once 40% of the
dataset has crossed, then run again to the end; what crossed in the two runs
beyond the dataset's size is what the kill cost (bytes read twice), as a
fraction of the dataset.

Run: ``make bench && .venv/bin/python benchmarks/replicate.py [--gib 1] [--small 10000] [--rss 10000,100000]``
(or ``--resume [--object-mib 32] [--kill-at 0.4]``, or ``--grid [--gib 1] [--object-mib 32] [--rounds 1]``)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Run, machine, precompile_stager, s5cmd_binary, table, timed, tool

from stager.config import DEFAULT_BLOCK_SIZE
from stager.hashing import StreamHasher
from stager.manifest import MANIFEST_PATH, Manifest, ShardEntry, encode_manifest
from stager.testing import PROFILES, FaultPlan, FaultProxy, S3Server, object_store_plan

MiB = 1 << 20
BLOCK = 8 * MiB
READ_FAULTS = dict(slowdown_p=0.02, error500_p=0.02, reset_p=0.02, truncate_p=0.02, flip_p=0.02)
WRITE_FAULTS = dict(slowdown_p=0.02, error500_p=0.02, reset_p=0.02)


def server_cpu(*servers: S3Server) -> float:
    """CPU seconds the servers have used so far (they take about as much as a client here)."""
    import psutil

    return sum(sum(psutil.Process(s.pid).cpu_times()[:2]) for s in servers)


def write_dataset(root: Path, sizes: list[int], prefix: str, seed: int, block: int = BLOCK) -> Manifest:
    """Random objects of ``sizes`` under ``root`` and their manifest (written straight to the server's disk)."""
    rng = np.random.default_rng(seed)
    entries = []
    for i, size in enumerate(sizes):
        name = f"{prefix}/{i % 100:02d}/obj-{i:06d}.bin"
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        hasher = StreamHasher(block)
        hasher.update(data)
        digest, blocks = hasher.finish()
        entries.append(ShardEntry(name, size, digest, tuple(blocks)))
    manifest = Manifest.from_entries(entries, block)
    (root / MANIFEST_PATH).parent.mkdir(parents=True, exist_ok=True)
    (root / MANIFEST_PATH).write_bytes(encode_manifest(manifest))
    return manifest


def verify(folder: Path, manifest: Manifest) -> bool:
    """Every object of the manifest is in ``folder`` with its digest."""
    for entry in manifest:
        try:
            with open(folder / entry.path, "rb") as fh:
                if xxhash.xxh3_128_hexdigest(fh.read()) != entry.digest:
                    return False
        except OSError:
            return False
    return True


def option_flags(flag: str, options: dict) -> list[str]:
    out: list[str] = []

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}{key}.", inner)
        else:
            out.extend([flag, f"{prefix[:-1]}={value}"])

    walk("", options)
    return out


def rclone_env(name: str, server: S3Server, endpoint: str) -> dict[str, str]:
    prefix = f"RCLONE_CONFIG_{name.upper()}_"
    return {prefix + "TYPE": "s3", prefix + "PROVIDER": "Other", prefix + "ENDPOINT": endpoint,
            prefix + "ACCESS_KEY_ID": server.access_key, prefix + "SECRET_ACCESS_KEY": server.secret_key,
            prefix + "REGION": "us-east-1"}


class Bench:
    def __init__(self, work: Path, src: S3Server, dst: S3Server) -> None:
        self.work = work
        self.src = src
        self.dst = dst
        self.runs = 0

    def stager(self, dataset: str, src_url: str, dst_url: str, target: str, *extra: str) -> Run:
        self.runs += 1
        argv = [sys.executable, "-m", "stager", "replicate", f"s3://src/{dataset}", f"s3://dst/{target}",
                *option_flags("-s", self.src.storage_options(src_url)),
                *option_flags("-d", self.dst.storage_options(dst_url)),
                "--state-dir", str(self.work / f"state-{self.runs}"), "--json", *extra]
        return timed("stager replicate", argv)

    def rclone(self, dataset: str, src_url: str, dst_url: str, target: str) -> Run | None:
        rclone = tool("rclone")
        if not rclone:
            return None
        config = self.work / "rclone.conf"
        config.touch()
        env = {**rclone_env("a", self.src, src_url), **rclone_env("b", self.dst, dst_url)}
        argv = [rclone, "--config", str(config), "copy", f"a:src/{dataset}", f"b:dst/{target}",
                "--exclude", ".stager/**", "--transfers", "16", "--checkers", "16", "--s3-upload-concurrency", "4",
                "--s3-chunk-size", "16M", "--multi-thread-streams", "4", "--retries", "10",
                "--low-level-retries", "20", "--s3-no-check-bucket"]
        return timed("rclone copy", argv, env)

    def s5cmd(self, dataset: str, src_url: str, dst_url: str, target: str) -> Run | None:
        s5 = s5cmd_binary()
        if not s5:
            return None
        local = self.work / f"s5cmd-{target.replace('/', '-')}"
        down = timed("s5cmd", [s5, "--endpoint-url", src_url, "--numworkers", "32", "--retry-count", "10", "cp",
                               "--concurrency", "4", "--part-size", "16", f"s3://src/{dataset}/*", f"{local}/"],
                     self.src.env(src_url))
        if down.returncode != 0:
            shutil.rmtree(local, ignore_errors=True)
            return down
        stager_dir = local / ".stager"
        shutil.rmtree(stager_dir, ignore_errors=True)
        up = timed("s5cmd", [s5, "--endpoint-url", dst_url, "--numworkers", "32", "--retry-count", "10", "cp",
                             "--concurrency", "4", "--part-size", "16", f"{local}/", f"s3://dst/{target}/"],
                   self.dst.env(dst_url))
        shutil.rmtree(local, ignore_errors=True)
        return Run("s5cmd cp via local disk", down.seconds + up.seconds, down.cpu_seconds + up.cpu_seconds,
                   max(down.peak_rss_mb, up.peak_rss_mb), up.returncode, up.stdout, down.stderr + up.stderr)


def row(run: Run, ok: bool, nbytes: int, objects: int, fastest: float | None, servers: float) -> list[str]:
    ratio = f"{fastest / run.seconds:.2f}x" if fastest and ok else "-"
    return [run.name, f"{run.seconds:.1f}", f"{nbytes / 1e6 / run.seconds:.0f}", f"{objects / run.seconds:.0f}",
            f"{run.cpu_seconds:.1f}", f"{servers:.1f}", f"{run.peak_rss_mb:.0f}",
            "yes" if ok else f"NO (exit {run.returncode})", ratio]


def compare(bench: Bench, dataset: str, manifest: Manifest, src_url: str, dst_url: str, label: str) -> list[list[str]]:
    results: list[tuple[Run, bool, float]] = []
    for name in ("stager", "rclone", "s5cmd"):
        target = f"{label}-{name}-{dataset}"
        before = server_cpu(bench.src, bench.dst)
        run = getattr(bench, name)(dataset, src_url, dst_url, target)
        if run is None:
            continue
        servers = server_cpu(bench.src, bench.dst) - before
        ok = run.returncode == 0 and verify(bench.dst.root / "dst" / target, manifest)
        if name == "stager" and run.returncode == 0:
            ok = ok and (bench.dst.root / "dst" / target / MANIFEST_PATH).exists()
        results.append((run, ok, servers))
        shutil.rmtree(bench.dst.root / "dst" / target, ignore_errors=True)
        if run.returncode != 0:
            print(f"  {run.name} failed: {run.stderr.strip().splitlines()[-1:] }", file=sys.stderr)
    fastest = min((r.seconds for r, ok, _ in results if not r.name.startswith("stager") and ok), default=None)
    return [[dataset, *row(r, ok, manifest.total_bytes, len(manifest), fastest, servers)]
            for r, ok, servers in results]


def killed_then_resumed(argv: list[str], env: dict[str, str], proxy: FaultProxy, total: int,
                        kill_at: float) -> tuple[float, int, int]:
    """Run ``argv`` until ``kill_at`` of ``total`` bytes crossed ``proxy``, SIGKILL it, run it again to the end.

    Returns the fraction of ``total`` read twice, the bytes at the kill and the second run's exit status.
    """
    proxy.reseed(0)
    full_env = {**os.environ, **env}
    proc = subprocess.Popen(argv, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while proxy.stats().bytes_down < kill_at * total and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    at_kill = proxy.stats().bytes_down
    second = subprocess.run(argv, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            timeout=600)
    if second.returncode != 0:
        print(f"  second run failed: {second.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    return (proxy.stats().bytes_down - total) / total, at_kill, second.returncode


def resume_runs(bench: Bench, args: argparse.Namespace) -> None:
    """stager and rclone, each killed at ``--kill-at`` of the dataset and run again: the bytes read twice."""
    src, dst = bench.src, bench.dst
    count = max(1, int(args.gib * 1024 / args.object_mib))
    dataset = write_dataset(src.root / "src" / "resume", [args.object_mib * MiB] * count, "r", seed=7)
    total = dataset.total_bytes
    print(f"dataset: {count} x {args.object_mib} MiB = {total / 2**30:.2f} GiB, killed at {args.kill_at:.0%}")
    rows = []
    with FaultProxy(src.endpoint_url, FaultPlan(methods=("GET",)), seed=1, credentials=src.credentials) as proxy:
        # the manifest and the listings cross it too: a few KiB
        state = bench.work / "resume-state"
        stager_argv = [sys.executable, "-m", "stager", "replicate", "s3://src/resume", "s3://dst/resume-stager",
                       *option_flags("-s", src.storage_options(proxy.url)),
                       *option_flags("-d", dst.storage_options(dst.endpoint_url)), "--state-dir", str(state),
                       *args.stager_args.split()]
        tools = [("stager replicate", stager_argv, {}, "resume-stager")]
        rclone = tool("rclone")
        if rclone:
            config = bench.work / "rclone.conf"
            config.touch()
            env = {**rclone_env("a", src, proxy.url), **rclone_env("b", dst, dst.endpoint_url)}
            base = [rclone, "--config", str(config), "copy", "a:src/resume"]
            tools.append(("rclone copy (tuned)", [*base, "b:dst/resume-rclone", "--exclude", ".stager/**",
                                                  "--transfers", "16", "--checkers", "16",
                                                  "--s3-upload-concurrency", "4", "--s3-chunk-size", "16M",
                                                  "--multi-thread-streams", "4", "--s3-no-check-bucket"],
                          env, "resume-rclone"))
            tools.append(("rclone copy (defaults)", [*base, "b:dst/resume-rclone-defaults", "--exclude", ".stager/**",
                                                     "--s3-no-check-bucket"], env, "resume-rclone-defaults"))
        for name, argv, env, target in tools:
            wasted, at_kill, code = killed_then_resumed(argv, env, proxy, total, args.kill_at)
            ok = code == 0 and verify(dst.root / "dst" / target, dataset)
            rows.append([name, f"{at_kill / total:.0%}", f"{wasted:.3f}", f"{wasted * total / MiB:.0f}",
                         "yes" if ok else f"NO (exit {code})", " ".join(argv[:4]) + " ..."])
            shutil.rmtree(dst.root / "dst" / target, ignore_errors=True)
    print("\n## killed (SIGKILL) and run again: bytes read twice at the source\n")
    print(table(rows, ["tool", "killed at", "re-read / dataset", "re-read MiB", "copy verifies", "command"]))
    print("\ncommands in full:")
    for name, argv, _, _ in tools:
        print(f"  {name}: {' '.join(argv)}")


def grid_runs(bench: Bench, args: argparse.Namespace) -> None:
    """stager (defaults), rclone (tuned) and s5cmd (tuned, via local disk) with the source behind each profile."""
    src = bench.src
    count = max(1, int(args.gib * 1024 / args.object_mib))
    # blocks of the default size, as `stager index` makes them
    manifest = write_dataset(src.root / "src" / "grid", [args.object_mib * MiB] * count, "g", seed=11,
                             block=DEFAULT_BLOCK_SIZE)
    print(f"dataset: {count} x {args.object_mib} MiB = {manifest.total_bytes / 2**30:.2f} GiB "
          f"({DEFAULT_BLOCK_SIZE // MiB} MiB blocks); {args.rounds} round(s), the median kept")
    headers = ["tool", "wall s", "MB/s", "client CPU s", "peak RSS MB", "verifies", "speed vs best peer"]
    summary = []
    for name, (description, _) in PROFILES.items():
        plan = object_store_plan(name)
        with FaultProxy(src.endpoint_url, plan, seed=5, credentials=src.credentials) as proxy:
            # loopback goes straight to the server: the proxy is Python on the same cores, a ceiling of its own
            src_url = proxy.url if name != "loopback" else src.endpoint_url
            runs: dict[str, list[tuple[Run, bool]]] = {}
            tools = ("stager", "rclone", "s5cmd")
            for turn in range(args.rounds):
                for i in range(len(tools)):
                    tool_name = tools[(turn + i) % len(tools)]
                    target = f"grid-{name}-{tool_name}"
                    run = getattr(bench, tool_name)("grid", src_url, bench.dst.endpoint_url, target)
                    if run is None:
                        continue
                    ok = run.returncode == 0 and verify(bench.dst.root / "dst" / target, manifest)
                    runs.setdefault(tool_name, []).append((run, ok))
                    shutil.rmtree(bench.dst.root / "dst" / target, ignore_errors=True)
                    if tool_name == "stager":
                        _account(run)
        medians = {t: (sorted(r, key=lambda x: x[0].seconds)[len(r) // 2][0], all(ok for _, ok in r))
                   for t, r in runs.items()}
        best = min((run.seconds for t, (run, ok) in medians.items() if t != "stager" and ok), default=None)
        rows = [[run.name, f"{run.seconds:.2f}", f"{manifest.total_bytes / 1e6 / run.seconds:.0f}",
                 f"{run.cpu_seconds:.1f}", f"{run.peak_rss_mb:.0f}", "yes" if ok else f"NO (exit {run.returncode})",
                 f"{best / run.seconds:.2f}x" if best and ok else "-"] for run, ok in medians.values()]
        print(f"\n## profile {name}: {description}\n")
        print(table(rows, headers))
        print(f"proxy answers: {json.dumps(proxy.faults)}")
        stager_run, stager_ok = medians["stager"]
        summary.append([name, f"{stager_run.seconds:.2f}", f"{best:.2f}" if best else "-",
                        f"{best / stager_run.seconds:.2f}x" if best and stager_ok else "-",
                        f"{stager_run.peak_rss_mb:.0f}", "yes" if all(ok for _, ok in medians.values()) else "NO"])
    print("\n## stager replicate (defaults) vs the best peer, per profile of the source\n")
    print(table(summary, ["profile", "stager s", "best peer s", "ratio", "stager peak RSS MB", "all verify"]))
    print("\ncommands: stager replicate s3://src/grid s3://dst/... -s endpoint_url=... -d endpoint_url=... "
          "--state-dir ... --json (no tuning); rclone and s5cmd as in Bench.rclone and Bench.s5cmd")


def _account(run: Run) -> None:
    try:
        summary = json.loads(run.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return
    print(f"stager's own account: {json.dumps({k: summary.get(k) for k in ('seconds', 'retries', 'concurrency_peak')})}")


def rss_runs(bench: Bench, counts: list[int]) -> list[list[str]]:
    rows = []
    for count in counts:
        dataset = f"tiny{count}"
        manifest = write_dataset(bench.src.root / "src" / dataset, [1024] * count, "t", seed=count)
        run = bench.stager(dataset, bench.src.endpoint_url, bench.dst.endpoint_url, f"rss-{dataset}",
                           "--concurrency", "32")
        ok = run.returncode == 0
        rows.append([f"{count:,}", f"{run.seconds:.1f}", f"{count / run.seconds:.0f}", f"{run.cpu_seconds:.1f}",
                     f"{run.peak_rss_mb:.0f}", "yes" if ok else f"NO (exit {run.returncode})"])
        shutil.rmtree(bench.dst.root / "dst" / f"rss-{dataset}", ignore_errors=True)
        shutil.rmtree(bench.src.root / "src" / dataset, ignore_errors=True)
        del manifest
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the large-object dataset in GiB")
    parser.add_argument("--object-mib", type=int, default=64, help="size of each large object in MiB")
    parser.add_argument("--small", type=int, default=10_000, help="number of small objects")
    parser.add_argument("--rss", default="10000,100000", help="object counts for the peak-RSS runs ('' to skip)")
    parser.add_argument("--no-faults", action="store_true", help="skip the runs through the fault proxy")
    parser.add_argument("--only-rss", action="store_true", help="only the peak-RSS runs")
    parser.add_argument("--resume", action="store_true", help="only the resume runs (killed, then run again)")
    parser.add_argument("--grid", action="store_true", help="only the origin-profile grid")
    parser.add_argument("--rounds", type=int, default=1, help="with --grid: runs of each tool per profile (median)")
    parser.add_argument("--kill-at", type=float, default=0.4, help="fraction of the dataset read before the kill")
    parser.add_argument("--stager-args", default="", help="extra options of stager replicate in the resume runs")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp dir)")
    args = parser.parse_args()
    precompile_stager()
    work = Path(args.work or tempfile.mkdtemp(prefix="stager-bench-replicate-"))
    print("# replicate benchmark: S3 to S3 between two rclone servers on loopback")
    print(f"machine: {machine()}")
    print(f"reproduce: .venv/bin/python benchmarks/replicate.py --gib {args.gib} --object-mib {args.object_mib} "
          f"--small {args.small} --rss {args.rss}" + (" --no-faults" if args.no_faults else "")
          + (" --only-rss" if args.only_rss else "") + (f" --resume --kill-at {args.kill_at}" if args.resume else "")
          + (f" --stager-args '{args.stager_args}'" if args.stager_args else "")
          + (f" --grid --rounds {args.rounds}" if args.grid else ""))
    began = time.monotonic()
    src = S3Server(work / "a" / "root", access_key="benchsrc" + "a" * 8, secret_key="srcsecret" + "s" * 16,
                   etag_hash="")
    dst = S3Server(work / "b" / "root", access_key="benchdst" + "b" * 8, secret_key="dstsecret" + "d" * 16,
                   etag_hash="")
    try:
        src.make_bucket("src")
        dst.make_bucket("dst")
        bench = Bench(work, src, dst)
        if args.resume:
            resume_runs(bench, args)
            return
        if args.grid:
            grid_runs(bench, args)
            return
        if not args.only_rss:
            compare_all(bench, args)
        counts = [int(c) for c in args.rss.split(",") if c.strip()]
        if counts:
            print("\n## stager peak RSS by object count (1 KiB objects)\n")
            print(table(rss_runs(bench, counts), ["objects", "wall s", "objects/s", "CPU s", "peak RSS MB",
                                                  "complete"]))
        print(f"\ntotal benchmark time: {time.monotonic() - began:.0f}s")
    finally:
        src.stop()
        dst.stop()
        shutil.rmtree(work, ignore_errors=True)


def compare_all(bench: Bench, args: argparse.Namespace) -> None:
    """The side-by-side runs: both datasets, clean, then through the fault proxies."""
    src, dst = bench.src, bench.dst
    count = max(1, int(args.gib * 1024 / args.object_mib))
    large = write_dataset(src.root / "src" / "large", [args.object_mib * MiB] * count, "l", seed=1)
    rng = np.random.default_rng(2)
    small = write_dataset(src.root / "src" / "small", rng.integers(4096, 32768, args.small).tolist(), "s", seed=3)
    print(f"datasets: large {len(large)} x {args.object_mib} MiB = {large.total_bytes / 2**30:.2f} GiB; "
          f"small {len(small):,} objects, {small.total_bytes / 1e6:.0f} MB")
    headers = ["dataset", "tool", "wall s", "MB/s", "objects/s", "client CPU s", "servers CPU s", "peak RSS MB",
               "verifies", "speed vs fastest verified peer"]
    rows = compare(bench, "large", large, src.endpoint_url, dst.endpoint_url, "clean")
    rows += compare(bench, "small", small, src.endpoint_url, dst.endpoint_url, "clean")
    print("\n## clean servers\n")
    print(table(rows, headers))
    if args.no_faults:
        return
    with FaultProxy(src.endpoint_url, FaultPlan(**READ_FAULTS, methods=("GET",)), seed=5,
                    credentials=src.credentials) as read_proxy, \
         FaultProxy(dst.endpoint_url, FaultPlan(**WRITE_FAULTS, methods=("PUT", "POST")), seed=6,
                    credentials=dst.credentials) as write_proxy:
        rows = compare(bench, "large", large, read_proxy.url, write_proxy.url, "faulty")
        rows += compare(bench, "small", small, read_proxy.url, write_proxy.url, "faulty")
        print("\n## through fault proxies (source GETs: 503, 500, reset, truncated, flipped bodies; "
              "destination PUT/POST: 503, 500, reset)\n")
        print(table(rows, headers))
        print(f"\nfaults injected: source {json.dumps(read_proxy.faults)}, "
              f"destination {json.dumps(write_proxy.faults)}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
