"""The FUSE mount: stager mount vs reading the cache's files directly (the limit) vs rclone mount, with fio.

One run, the same data, side by side:

1. **cold** (nothing staged; every cache empty): first-byte latency (open +
   4 KiB read of files never read before) and sequential throughput (one fio
   pass over every file, 1 MiB reads), stager mount vs ``rclone mount
   --vfs-cache-mode full`` of the same bucket;
2. **warm** (everything staged and read once): fio sequential 1 MiB reads and
   random 4-128 KiB reads, several jobs, on the stager mount, on the cache's
   blob files directly (the limit: same bytes, no FUSE), and on the rclone
   mount (after its own warm-up pass), in interleaved rounds (medians).
   stager keeps the kernel page cache between opens (the shards never
   change), which is what "warm" means for it; a second stager row drops that
   page cache (fio ``invalidate=1``), so every read goes through FUSE to the
   mount process;
3. **listing** of a 10,000-file dataset: ``find`` and ``ls -lR`` on both mounts;
4. **readpath** (issue #15 item 5, root only: it drops the page cache): staged files read once, the page
   cache dropped, then one sequential pass (fio 1 MiB, ``cat``) on the mount and on the cache's files
   directly (the limit); 2,000 cold files of 256 KiB read with ``cat`` in walk order, stager mount vs
   rclone mount, fresh mounts and caches each round; cold random reads (fio, 1 MiB and 128 KiB; and
   128 KiB reads of the same files indexed in 128 KiB blocks), bytes the origin sent (counted at a
   proxy in front of it) per byte read, stager vs rclone. ``--phases readpath`` runs it alone.

The origin is ``rclone serve s3`` on loopback. Each mount's process CPU
seconds are reported beside wall time (on 2 cores the origin server takes CPU
too). Targets: warm sequential >= 0.8x the direct limit and ahead of rclone
mount; cold first byte faster than rclone mount; listing 10,000 files < 1 s; with the page cache
dropped, sequential reads >= 0.8x the direct read; cold small files >= rclone mount; cold random reads
fetch <= 2x the bytes they read.

Setup (once): ``make bench`` and fio (``apt-get install fio``; this script
installs it with apt-get when it is missing and it runs as root).
Run: ``.venv/bin/python benchmarks/fuse.py [--gib 1] [--file-mib 32] [--jobs 4] [--runtime 8]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import xxhash

# This file is named like the package it measures: import the package before this folder is on the path.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
from stager.fuse import mount_pid  # noqa: E402

sys.path.insert(0, str(_HERE))
from harness import machine, precompile_stager, table, tool  # noqa: E402

from stager.manifest import Manifest, ShardEntry  # noqa: E402
from stager.manifest.parquet import encode_manifest  # noqa: E402
from stager.testing import FaultProxy, S3Server  # noqa: E402
from stager.write import generate_corpus  # noqa: E402

MiB = 1 << 20
STAGER = [sys.executable, "-m", "stager"]


# -- set-up ---------------------------------------------------------------------------------------


def ensure_fio() -> str:
    found = shutil.which("fio")
    if found:
        return found
    if os.getuid() != 0:
        sys.exit("fio is not installed: apt-get install fio (as root), then run again")
    print("installing fio with apt-get ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(["apt-get", "install", "-y", "-qq", "fio"], env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=True, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "fio"], env=env, check=True, capture_output=True)
    return shutil.which("fio") or sys.exit("fio could not be installed")


def many_files(root: Path, count: int) -> None:
    """``count`` small files in 10 folders, and their manifest (written directly: hashing is trivial)."""
    entries = []
    for i in range(count):
        path = f"part-{i % 10:02d}/file-{i:05d}.txt"
        data = f"file {i}\n".encode() * 8
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
        entries.append(ShardEntry(path, len(data), xxhash.xxh3_128_hexdigest(data), (xxhash.xxh3_64_intdigest(data),),
                                  mtime=time.time()))
    (root / ".stager").mkdir(exist_ok=True)
    (root / ".stager" / "manifest.parquet").write_bytes(encode_manifest(Manifest.from_entries(entries, 8 * MiB)))


class Mounts:
    """Every mount this run made; all are unmounted at the end, whatever happens."""

    def __init__(self, server: S3Server, work: Path, endpoint: str | None = None) -> None:
        self.server = server
        self.work = work
        self.endpoint = endpoint or server.endpoint_url  # a counting proxy in front of the server, if given
        self.points: list[Path] = []
        self.procs: list[subprocess.Popen] = []

    def s3_options(self) -> list[str]:
        s = self.server
        return ["-o", f"key={s.access_key}", "-o", f"secret={s.secret_key}",
                "-o", f"client_kwargs.endpoint_url={self.endpoint}"]

    def stager(self, prefix: str, name: str, cache: Path) -> tuple[Path, int]:
        point = self.work / name
        point.mkdir(parents=True, exist_ok=True)
        self.points.append(point)
        subprocess.run([*STAGER, "mount", f"s3://bench/{prefix}", str(point), *self.s3_options(), "--cache",
                        str(cache), "--capacity", "20GB", "--no-daemon", "--log-file", str(self.work / f"{name}.log")],
                       check=True, capture_output=True, text=True, timeout=300)
        pid = mount_pid(point)
        assert pid is not None
        return point, pid

    def rclone(self, prefix: str, name: str, cache: Path) -> tuple[Path, int] | None:
        rclone = tool("rclone")
        if rclone is None:
            return None
        point = self.work / name
        point.mkdir(parents=True, exist_ok=True)
        s = self.server
        proc = subprocess.Popen(
            [rclone, "mount", f":s3:bench/{prefix}", str(point), "--s3-provider", "Other", "--s3-endpoint",
             self.endpoint, "--s3-access-key-id", s.access_key, "--s3-secret-access-key", s.secret_key,
             "--vfs-cache-mode", "full", "--cache-dir", str(cache), "--read-only", "--dir-cache-time", "1h",
             "--config", str(self.work / "rclone-empty.conf")],
            stdout=subprocess.DEVNULL, stderr=open(self.work / f"{name}.log", "wb"))
        self.procs.append(proc)
        self.points.append(point)
        deadline = time.monotonic() + 60
        while not os.path.ismount(point):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rclone mount did not come up (log {self.work / f'{name}.log'})")
            time.sleep(0.05)
        return point, proc.pid

    def unmount(self, point: Path) -> None:
        if os.path.ismount(point):
            subprocess.run(["fusermount3", "-u", str(point)], capture_output=True, timeout=30)
        if os.path.ismount(point):
            subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=30)

    def close(self) -> None:
        for point in reversed(self.points):
            self.unmount(point)
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


def cpu(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system + t.children_user + t.children_system
    except psutil.Error:
        return float("nan")


# -- measurements ---------------------------------------------------------------------------------


def fio(fio_bin: str, name: str, files: list[Path], *, rw: str, bs: str, jobs: int, runtime: float | None,
        invalidate: bool = False, one_file_at_a_time: bool = False, io_size: str | None = None) -> dict[str, float]:
    """One fio job over ``files``: MB/s and mean latency (µs) across ``jobs`` jobs."""
    argv = [fio_bin, f"--name={name}", "--filename=" + ":".join(str(f).replace(":", "\\:") for f in files),
            f"--rw={rw}", f"--numjobs={jobs}", "--ioengine=psync", "--direct=0", "--readonly", "--group_reporting",
            f"--invalidate={1 if invalidate else 0}", "--output-format=json"]
    argv += [f"--bsrange={bs}"] if "-" in bs else [f"--bs={bs}"]
    if rw == "randread":
        argv += ["--norandommap", "--randrepeat=0"]
    if one_file_at_a_time:
        argv += ["--file_service_type=sequential"]
    if runtime:
        argv += ["--time_based", f"--runtime={runtime}"]
    if io_size:
        argv += [f"--io_size={io_size}"]
    out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=1800).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    return {"MBps": job["bw_bytes"] / 1e6, "lat_us": job["lat_ns"]["mean"] / 1e3, "iops": job["iops"],
            "bytes": job["io_bytes"]}


def first_bytes(files: list[Path]) -> list[float]:
    """Seconds from open to the first 4 KiB of each file (files never read before)."""
    out = []
    for f in files:
        began = time.perf_counter()
        fd = os.open(f, os.O_RDONLY)
        try:
            os.pread(fd, 4096, 0)
        finally:
            os.close(fd)
        out.append(time.perf_counter() - began)
    return out


def read_all(files: list[Path]) -> None:
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(4 * MiB):
                pass


def listing(point: Path) -> dict[str, float]:
    began = time.monotonic()
    found = subprocess.run(["find", str(point)], check=True, capture_output=True, text=True).stdout.count("\n")
    find_s = time.monotonic() - began
    began = time.monotonic()
    subprocess.run(["ls", "-lR", str(point)], check=True, capture_output=True)
    return {"find_s": find_s, "ls_s": time.monotonic() - began, "entries": found}


def drop_page_cache() -> None:
    """Drop the kernel's page cache (clean pages of every file: the cache's blobs and the mount's alike)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def cat(files: list[Path]) -> float:
    """Seconds ``cat`` takes to read ``files`` in order to /dev/null."""
    began = time.perf_counter()
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True, timeout=1800)
    return time.perf_counter() - began


def small_files(root: Path, count: int, size: int) -> list[str]:
    """``count`` files of ``size`` random bytes in 20 folders; their names in walk order."""
    rng = np.random.default_rng(7)
    names = [f"d{i % 20:02d}/f{i:05d}.bin" for i in range(count)]
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    return sorted(names)


def read_path(args, fio_bin: str, server: S3Server, proxy, work: Path, bucket: Path, names: list[str],
              manifest) -> dict:
    """The three figures of the mount's read path (issue #15 item 5), every peer in the same run:

    - warm from disk: staged, page cache dropped, one sequential pass (fio 1 MiB, ``cat``) on the mount and on
      the cache's blob files directly (the limit);
    - cold small files: ``cat`` of every small file in walk order, fresh mounts and caches, page cache dropped,
      stager mount vs rclone mount;
    - cold random: fio random reads on a fresh mount, bytes the origin sent (counted at the proxy in front of
      it) over the bytes fio read, stager mount vs rclone mount.
    """
    mounts = Mounts(server, work, endpoint=proxy.url)
    out: dict = {"warm_disk": {}, "small": {}, "random": {}}
    try:
        # (a) warm from disk
        cache = work / "rp-cache"
        subprocess.run([*STAGER, "stage", "s3://bench/corpus", *mounts.s3_options(), "--cache", str(cache),
                        "--capacity", "20GB", "--no-daemon"], check=True, capture_output=True, timeout=1800)
        point, pid = mounts.stager("corpus", "rp-warm", cache)
        mounted = [point / n for n in names]
        blobs = [cache / "blobs" / manifest.digest(i)[:2] / manifest.digest(i) for i in range(len(names))]
        read_all(mounted)  # this mount process checks each block once (its first read)
        runs: dict[str, list[dict[str, float]]] = {}
        for r in range(args.rounds):
            order = [("direct cache files (limit)", blobs, None), ("stager mount", mounted, pid)]
            for label, files, p in (order if r % 2 == 0 else order[::-1]):
                drop_page_cache()
                cpu0 = cpu(p) if p else 0.0
                seq = fio(fio_bin, "disk-seq", files, rw="read", bs="1M", jobs=1, runtime=None,
                          one_file_at_a_time=True)
                cpu_s = (cpu(p) - cpu0) if p else 0.0
                drop_page_cache()
                seconds = cat(files)
                runs.setdefault(label, []).append({"fio_MBps": seq["MBps"], "cat_MBps": manifest.total_bytes / seconds / 1e6,
                                                   "cpu_s": cpu_s})
        out["warm_disk"] = runs
        mounts.unmount(point)

        # (b) cold small files
        small = small_files(bucket / "small", args.small_files, args.small_kib << 10)
        subprocess.run([*STAGER, "index", str(bucket / "small")], check=True, capture_output=True, timeout=600)
        small_bytes = args.small_files * (args.small_kib << 10)
        runs = {}
        for r in range(args.rounds):
            peers = [("stager mount", *mounts.stager("small", f"rp-small{r}", work / f"rp-small{r}-stager"))]
            rc = mounts.rclone("small", f"rp-small-rc{r}", work / f"rp-small{r}-rclone")
            if rc:
                peers.append(("rclone mount", *rc))
            for label, point, p in (peers if r % 2 == 0 else peers[::-1]):
                drop_page_cache()
                before, cpu0 = proxy.stats().bytes_down, cpu(p)
                seconds = cat([point / n for n in small])
                runs.setdefault(label, []).append({"MBps": small_bytes / seconds / 1e6, "cpu_s": cpu(p) - cpu0,
                                                   "fetched": (proxy.stats().bytes_down - before) / small_bytes})
            for _, point, _ in peers:
                mounts.unmount(point)
        out["small"] = runs

        # (c) cold random: bytes from the origin per byte read; a block (1 MiB by default) is what is verified,
        # so reads smaller than half a block fetch more than twice what they read: the same files indexed in
        # 128 KiB blocks (hard links, no second copy) show what a dataset indexed for small reads costs
        (bucket / "corpus-128k").mkdir(exist_ok=True)
        for name in names:
            if not (bucket / "corpus-128k" / name).exists():
                os.link(bucket / "corpus" / name, bucket / "corpus-128k" / name)
        subprocess.run([*STAGER, "index", str(bucket / "corpus-128k"), "--block-size", "128KiB"], check=True,
                       capture_output=True, timeout=600)
        cases = [(bs, "corpus", bs) for bs in args.random_bs.split(",")] + [("128k, 128 KiB blocks", "corpus-128k",
                                                                              "128k")]
        runs = {}
        for r in range(args.rounds):
            for n, (case, prefix, bs) in enumerate(cases):
                peers = [("stager mount", *mounts.stager(prefix, f"rp-rand{r}-{n}", work / f"rp-rand{r}-{n}-st"))]
                rc = mounts.rclone(prefix, f"rp-rand-rc{r}-{n}", work / f"rp-rand{r}-{n}-rc") \
                    if prefix == "corpus" else None
                if rc:
                    peers.append(("rclone mount", *rc))
                for label, point, p in (peers if r % 2 == 0 else peers[::-1]):
                    before = proxy.stats().bytes_down
                    res = fio(fio_bin, "cold-rand", [point / n for n in names], rw="randread", bs=bs, jobs=1,
                              runtime=None, io_size=f"{int(manifest.total_bytes * args.random_fraction)}")
                    time.sleep(2)  # what the mount still fetches for those reads counts too
                    fetched = proxy.stats().bytes_down - before
                    runs.setdefault(f"{label}, {case}", []).append(
                        {"MBps": res["MBps"], "read": res["bytes"], "fetched": fetched,
                         "amplification": fetched / max(1, res["bytes"])})
                for _, point, _ in peers:
                    mounts.unmount(point)
        out["random"] = runs
    finally:
        mounts.close()
    return out


def report_read_path(rp: dict) -> None:
    med = statistics.median
    print("\n## the read path (issue #15 item 5; medians of the rounds)\n")
    warm = rp["warm_disk"]
    rows = [[k, f"{med(r['fio_MBps'] for r in v):.0f}", f"{med(r['cat_MBps'] for r in v):.0f}",
             f"{med(r['cpu_s'] for r in v):.1f}"] for k, v in warm.items()]
    print(table(rows, ["staged, page cache dropped", "fio seq 1M MB/s", "cat MB/s", "mount CPU s (fio pass)"]))
    small = rp["small"]
    rows = [[k, f"{med(r['MBps'] for r in v):.1f}", f"{med(r['fetched'] for r in v):.2f}",
             f"{med(r['cpu_s'] for r in v):.1f}"] for k, v in small.items()]
    print()
    print(table(rows, ["cold small files (cat)", "MB/s", "fetched / size", "mount CPU s"]))
    rand = rp["random"]
    rows = [[k, f"{med(r['MBps'] for r in v):.1f}", f"{med(r['read'] for r in v) / MiB:.0f}",
             f"{med(r['fetched'] for r in v) / MiB:.0f}", f"{med(r['amplification'] for r in v):.2f}"]
            for k, v in rand.items()]
    print()
    print(table(rows, ["cold random reads (fio)", "MB/s", "MiB read", "MiB fetched", "fetched / read"]))
    limit, ours = warm.get("direct cache files (limit)"), warm.get("stager mount")
    if limit and ours:
        print(f"\n- warm from disk: fio {med(r['fio_MBps'] for r in ours) / med(r['fio_MBps'] for r in limit):.2f}x, "
              f"cat {med(r['cat_MBps'] for r in ours) / med(r['cat_MBps'] for r in limit):.2f}x the direct read "
              f"(target >= 0.8x); rounds' fio ratios: "
              + ", ".join(f"{a['fio_MBps'] / b['fio_MBps']:.2f}" for a, b in zip(ours, limit)))
    if "rclone mount" in small:
        print(f"- cold small files: {med(r['MBps'] for r in small['stager mount']) / med(r['MBps'] for r in small['rclone mount']):.2f}x "
              "rclone mount (target >= 1x)")
    for k, v in rand.items():
        print(f"- cold random, {k}: {med(r['amplification'] for r in v):.2f}x the bytes read fetched (target <= 2x)")


# -- the run --------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="dataset size in GiB")
    parser.add_argument("--file-mib", type=int, default=32, help="file size in MiB")
    parser.add_argument("--jobs", type=int, default=4, help="fio jobs (readers) at once")
    parser.add_argument("--runtime", type=float, default=5.0, help="seconds per warm fio run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every measurement, peers alternating "
                                                             "(medians: the machine's load drifts)")
    parser.add_argument("--cold-files", type=int, default=8, help="files for the first-byte latency")
    parser.add_argument("--listing-files", type=int, default=10_000)
    parser.add_argument("--phases", default="cold,warm,listing,readpath",
                        help="which phases to run (comma-separated; readpath: issue #15 item 5's three figures)")
    parser.add_argument("--small-files", type=int, default=2000, help="files in the read path's cold small-file phase")
    parser.add_argument("--small-kib", type=int, default=256, help="their size in KiB")
    parser.add_argument("--random-bs", default="1M,128k", help="fio block sizes of the cold random reads")
    parser.add_argument("--random-fraction", type=float, default=0.125,
                        help="bytes read at random per run, as a fraction of the dataset")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the data, caches and logs in the scratch folder")
    args = parser.parse_args()
    precompile_stager()
    fio_bin = ensure_fio()
    work = Path(args.work or tempfile.mkdtemp(prefix="stager-fuse-bench-"))
    files_n = max(2, int(args.gib * 1024 / args.file_mib))
    print(f"# fuse benchmark: {files_n} files x ~{args.file_mib} MiB, {args.jobs} fio jobs, from rclone serve s3 "
          f"on loopback\n# machine: {machine()}\n# work: {work}", flush=True)
    server = S3Server(work / "s3", etag_hash="")
    mounts = Mounts(server, work)
    (work / "rclone-empty.conf").touch()
    results: dict[str, dict] = {}
    try:
        bucket = server.make_bucket("bench")
        manifest = generate_corpus(bucket / "corpus", shards=files_n, tokens_per_shard=args.file_mib * MiB // 2,
                                   seed=1, jitter=0.0)  # the default block size (1 MiB)
        phases = set(args.phases.split(","))
        if "listing" in phases:
            many_files(bucket / "many", args.listing_files)
        if "cold" in phases:
            # the same files indexed in 8 MiB blocks (hard links: no second copy): what first bytes cost with them
            (bucket / "corpus-8m").mkdir()
            for name in manifest.paths:
                os.link(bucket / "corpus" / name, bucket / "corpus-8m" / name)
            subprocess.run([*STAGER, "index", str(bucket / "corpus-8m"), "--block-size", "8MiB"], check=True,
                           capture_output=True, timeout=600)
        names = list(manifest.paths)
        total = manifest.total_bytes

        if "readpath" in phases:
            if os.getuid() != 0:
                sys.exit("the readpath phase drops the page cache: run as root, or leave it out of --phases")
            proxy = FaultProxy(server.endpoint_url)  # no faults: it counts what the origin sends
            try:
                results["readpath"] = read_path(args, fio_bin, server, proxy, work, bucket, names, manifest)
            finally:
                proxy.stop()
        # 1. cold: empty caches, first use; fresh mounts and caches in each round, peers alternating.
        # First bytes of the last files, in reverse order (so that no read-ahead runs ahead of them),
        # then one sequential pass, file after file, over the others.
        probe_names = names[-args.cold_files:][::-1]
        pass_names = names[:-args.cold_files] or names[:1]
        cold_runs: dict[str, list[dict[str, float]]] = {}
        for r in range(args.rounds if "cold" in phases else 0):
            peers = [("stager mount", *mounts.stager("corpus", f"stager-cold{r}", work / f"cold{r}-stager"), True),
                     ("stager mount, 8 MiB blocks",
                      *mounts.stager("corpus-8m", f"stager-8m{r}", work / f"cold{r}-stager-8m"), False)]
            rc = mounts.rclone("corpus", f"rclone-cold{r}", work / f"cold{r}-rclone")
            if rc:
                peers.append(("rclone mount", *rc, True))
            if r % 2:
                peers.reverse()
            for label, point, pid, full in peers:
                lat = first_bytes([point / n for n in probe_names])
                row = {"first_byte_ms_median": statistics.median(lat) * 1e3, "first_byte_ms_max": max(lat) * 1e3,
                       "seq_MBps": float("nan"), "cpu_s": float("nan")}
                if full:
                    cpu0 = cpu(pid)
                    seq = fio(fio_bin, "cold-seq", [point / n for n in pass_names], rw="read", bs="1M", jobs=1,
                              runtime=None, one_file_at_a_time=True)
                    row["seq_MBps"], row["cpu_s"] = seq["MBps"], cpu(pid) - cpu0
                cold_runs.setdefault(label, []).append(row)
            for _, point, _, _ in peers:
                mounts.unmount(point)
            for leftover in work.glob(f"cold{r}-*"):
                shutil.rmtree(leftover, ignore_errors=True)
        if cold_runs:
            results["cold"] = {label: {key: statistics.median(row[key] for row in rows) for key in rows[0]}
                               for label, rows in cold_runs.items()}
            results["cold_rounds"] = cold_runs
        if "warm" in phases:
            warm_phase(args, fio_bin, mounts, work, manifest, names, results)
        if "listing" in phases:
            ls_st, _ = mounts.stager("many", "stager-many", work / "stager-cache")
            lists = {"stager mount": listing(ls_st)}
            rc_many = mounts.rclone("many", "rclone-many", work / "rclone-cache-many")
            if rc_many:
                lists["rclone mount"] = listing(rc_many[0])
            results["listing"] = lists
    finally:
        mounts.close()
        server.stop()

    report(results, total, args)
    (work / "results.json").write_text(json.dumps(results, indent=2))
    if not args.keep:  # the data and caches are a few GiB
        for child in work.iterdir():
            if child.is_dir():
                shutil.rmtree(child)
            elif child.name != "results.json":
                child.unlink()
    print(f"\nraw results: {work / 'results.json'}")
    print("reproduce: .venv/bin/python benchmarks/fuse.py " + " ".join(sys.argv[1:]))


def warm_phase(args, fio_bin: str, mounts: Mounts, work: Path, manifest, names: list[str], results: dict) -> None:
    """2. warm: everything staged and read once (fills the page cache kept between opens)."""
    st_point, st_pid = mounts.stager("corpus", "stager-mnt", work / "stager-cache")
    rc = mounts.rclone("corpus", "rclone-mnt", work / "rclone-cache")
    peers = [("stager mount", st_point, st_pid)] + ([("rclone mount", *rc)] if rc else [])
    subprocess.run([*STAGER, "stage", "s3://bench/corpus", *mounts.s3_options(), "--cache",
                    str(work / "stager-cache"), "--capacity", "20GB", "--no-daemon"], check=True,
                   capture_output=True, timeout=1800)
    for _, point, _ in peers:
        read_all([point / n for n in names])
    blobs = [work / "stager-cache" / "blobs" / manifest.digest(i)[:2] / manifest.digest(i) for i in range(len(names))]
    assert all(b.exists() for b in blobs), "the cache does not hold every blob"
    read_all(blobs)
    targets = [("direct cache files (limit)", blobs, None, False),
               ("stager mount", [st_point / n for n in names], st_pid, False),
               ("stager mount, page cache dropped", [st_point / n for n in names], st_pid, True)]
    if rc:
        targets.append(("rclone mount", [rc[0] / n for n in names], rc[1], False))
    runs: dict[str, list[dict[str, float]]] = {label: [] for label, *_ in targets}
    for _ in range(args.rounds):  # interleaved rounds, medians: the machine's load drifts
        for label, files, pid, invalidate in targets:
            row = {}
            for kind, rw, bs in (("seq", "read", "1M"), ("rand", "randread", "4k-128k")):
                cpu0 = cpu(pid) if pid else 0.0
                r = fio(fio_bin, f"warm-{kind}", files, rw=rw, bs=bs, jobs=args.jobs, runtime=args.runtime,
                        invalidate=invalidate)
                row[f"{kind}_MBps"], row[f"{kind}_lat_us"] = r["MBps"], r["lat_us"]
                row[f"{kind}_cpu_s"] = (cpu(pid) - cpu0) if pid else 0.0
            runs[label].append(row)
    warm = {label: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
            for label, rows in runs.items()}
    results["warm_rounds"] = runs
    results["warm"] = warm


def report(results: dict, total: int, args) -> None:
    if "readpath" in results:
        report_read_path(results["readpath"])
    if not {"cold", "warm", "listing"} <= results.keys():
        return
    cold, warm, lists = results["cold"], results["warm"], results["listing"]
    print(f"\n## cold (nothing staged; medians of {args.rounds} rounds, fresh mounts and caches each)\n")
    rows = [[k, f"{v['first_byte_ms_median']:.1f}", f"{v['first_byte_ms_max']:.1f}",
             "-" if v["seq_MBps"] != v["seq_MBps"] else f"{v['seq_MBps']:.0f}",
             "-" if v["cpu_s"] != v["cpu_s"] else f"{v['cpu_s']:.1f}"] for k, v in cold.items()]
    print(table(rows, ["mount", "first byte ms (median)", "first byte ms (max)", "seq MB/s (1 pass)",
                       "mount CPU s"]))
    print(f"\n## warm (staged, read once; medians of {args.rounds} interleaved rounds)\n")
    rows = [[k, f"{v['seq_MBps']:.0f}", f"{v['rand_MBps']:.0f}", f"{v['rand_lat_us']:.0f}", f"{v['seq_cpu_s']:.1f}",
             f"{v['rand_cpu_s']:.1f}"] for k, v in warm.items()]
    print(table(rows, ["reader", "seq 1M MB/s", "rand 4-128K MB/s", "rand lat us", "mount CPU s (seq)",
                       "mount CPU s (rand)"]))
    print("\n## listing\n")
    rows = [[k, v["entries"], f"{v['find_s']:.2f}", f"{v['ls_s']:.2f}"] for k, v in lists.items()]
    print(table(rows, ["mount", "entries", "find s", "ls -lR s"]))
    limit = warm["direct cache files (limit)"]["seq_MBps"]
    ours = warm["stager mount"]["seq_MBps"]
    print("\n## against the targets\n")
    print(f"- warm sequential: {ours / limit:.2f}x the direct limit (target >= 0.8x)")
    if "rclone mount" in warm:
        print(f"- warm sequential: {ours / warm['rclone mount']['seq_MBps']:.2f}x rclone mount (target > 1x); "
              f"random: {warm['stager mount']['rand_MBps'] / warm['rclone mount']['rand_MBps']:.2f}x")
    if "rclone mount" in cold:
        print(f"- cold first byte: {cold['stager mount']['first_byte_ms_median']:.1f} ms (1 MiB blocks, the default), "
              f"{cold['stager mount, 8 MiB blocks']['first_byte_ms_median']:.1f} ms with 8 MiB blocks, vs rclone "
              f"{cold['rclone mount']['first_byte_ms_median']:.1f} ms (target: below); cold sequential "
              f"{cold['stager mount']['seq_MBps'] / cold['rclone mount']['seq_MBps']:.2f}x rclone")
    print(f"- listing {args.listing_files} files: find {lists['stager mount']['find_s']:.2f} s, ls -lR "
          f"{lists['stager mount']['ls_s']:.2f} s (target < 1 s)")


if __name__ == "__main__":
    main()
