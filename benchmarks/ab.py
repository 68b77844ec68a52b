"""Two trees of stager on one measurement, alternating: is a change a regression?

A before-and-after comparison on a shared, noisy machine needs both sides in
one run, against the same origin, taking turns (A B, B A, A B, ...) so that a
drift of the machine's load hits both alike. Each tree runs its own code
(``PYTHONPATH`` and the working directory at the tree); the origin, its
proxy and this script are the current tree's. A tree whose ``fuse/`` is not
installed as ``stager.fuse`` needs a symbolic link ``stager/fuse -> ../fuse``
(an untracked file) for ``mount`` to run its own mount code.

Measurements:

* ``stage PROFILE``: ``stager stage`` with its defaults of a corpus (16
  shards of 32 MiB) behind one origin profile of :mod:`stager.loopback`
  (loopback, near, far, throttled): wall seconds, and stager's own account.
* ``mount``: ``stager mount`` (an engine in the mount's process) of 16 files
  of 16 MiB: the cold first byte (open + 4 KiB read) of 8 files never read,
  in reverse order, then one sequential pass over the 8 others (MB/s).

Printed: each tree's medians, and the per-round ratio before/after (above 1
where the second tree did better), with the load average of each round.

    python benchmarks/ab.py --before ../old-tree --after . --rounds 8 stage throttled
    python benchmarks/ab.py --before ../old-tree --after . --rounds 16 mount
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stager.testing import FaultProxy, S3Server, object_store_plan  # noqa: E402
from stager.write import generate_corpus  # noqa: E402

MiB = 1 << 20


def stager(tree: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stager", *args], env={**env, "PYTHONPATH": str(tree)}, cwd=tree,
                          capture_output=True, text=True, timeout=600)


def stage_round(tree: Path, work: Path, env: dict[str, str], capacity: int) -> dict[str, float]:
    cache = work / "cache"
    began = time.perf_counter()
    run = stager(tree, "stage", "s3://bench/corpus", "--cache", str(cache), "--capacity", str(capacity), "--json",
                 env=env)
    wall = time.perf_counter() - began
    if run.returncode:
        raise SystemExit(f"{tree}: stager stage failed: {run.stderr.strip()[-2000:]}")
    shutil.rmtree(cache)
    return {"wall s": wall, "own s": json.loads(run.stdout.strip().splitlines()[-1])["seconds"]}


def mount_round(tree: Path, work: Path, env: dict[str, str], server: S3Server, names: list[str],
                r: int) -> dict[str, float]:
    from stager.fuse.mount import mount_pid

    point, cache = work / f"point{r}", work / f"cache{r}"  # new each round: the last mount may still be exiting
    point.mkdir()
    run = stager(tree, "mount", "s3://bench/corpus", str(point), "-o", f"key={server.access_key}", "-o",
                 f"secret={server.secret_key}", "-o", f"client_kwargs.endpoint_url={server.endpoint_url}",
                 "--cache", str(cache), "--capacity", "20GB", "--no-daemon", env=env)
    if run.returncode:
        raise SystemExit(f"{tree}: stager mount failed: {run.stderr.strip()[-2000:]}")
    pid = mount_pid(point)
    try:
        time.sleep(0.5)
        latencies = []
        for name in names[-8:][::-1]:
            began = time.perf_counter()
            fd = os.open(point / name, os.O_RDONLY)
            try:
                os.pread(fd, 4096, 0)
            finally:
                os.close(fd)
            latencies.append(time.perf_counter() - began)
        began, nbytes = time.perf_counter(), 0
        for name in names[:8]:
            with open(point / name, "rb", buffering=0) as f:
                while chunk := f.read(MiB):
                    nbytes += len(chunk)
        seq = nbytes / 1e6 / (time.perf_counter() - began)
    finally:
        subprocess.run(["fusermount3", "-u", str(point)], capture_output=True, timeout=60)
    deadline = time.monotonic() + 30
    while (os.path.ismount(point) or (pid and Path(f"/proc/{pid}").exists())) and time.monotonic() < deadline:
        time.sleep(0.05)  # the mount's process finishes its writes before the next round starts
    shutil.rmtree(cache, ignore_errors=True)
    return {"first byte ms": statistics.median(latencies) * 1e3, "cold seq MB/s": seq}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the older tree")
    parser.add_argument("--after", type=Path, required=True, help="the newer tree")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("what", choices=["stage", "mount"])
    parser.add_argument("profile", nargs="?", default="loopback", help="with stage: the origin profile")
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for label, tree in trees.items():
        if not (tree / "stager" / "__init__.py").is_file():
            parser.error(f"--{label} {tree}: not a stager tree (no stager/__init__.py)")
    work = Path(tempfile.mkdtemp(prefix="stager-ab-"))
    server = S3Server(work / "s3", etag_hash="")
    rows: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    loads: list[float] = []
    try:
        bucket = server.make_bucket("bench")
        if args.what == "stage":
            manifest = generate_corpus(bucket / "corpus", shards=16, tokens_per_shard=16 * MiB, seed=1, jitter=0.0)
        else:
            manifest = generate_corpus(bucket / "corpus", shards=16, tokens_per_shard=8 * MiB, seed=1, jitter=0.0)
        plan = object_store_plan(args.profile)
        with FaultProxy(server.endpoint_url, plan, seed=5, credentials=server.credentials) as proxy:
            endpoint = server.endpoint_url if args.profile == "loopback" else proxy.url
            env = server.env(endpoint)
            print(f"# {args.what} {args.profile if args.what == 'stage' else ''}: {args.rounds} rounds, "
                  f"before {trees['before']}, after {trees['after']}", flush=True)
            for r in range(args.rounds):
                order = list(trees) if r % 2 == 0 else list(trees)[::-1]
                for label in order:
                    side = work / label
                    side.mkdir(exist_ok=True)
                    if args.what == "stage":
                        row = stage_round(trees[label], side, env, manifest.total_bytes * 2)
                    else:
                        row = mount_round(trees[label], side, env, server, list(manifest.paths), r)
                    rows[label].append(row)
                loads.append(os.getloadavg()[0])
                print(f"round {r + 1}: " + "; ".join(f"{label} " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                                              rows[label][-1].items())
                                                      for label in trees) + f"; load {loads[-1]:.1f}", flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print()
    for key in rows["before"][0]:
        before = [row[key] for row in rows["before"]]
        after = [row[key] for row in rows["after"]]
        higher_better = key.endswith("MB/s")
        ratios = [(a / b if higher_better else b / a) for b, a in zip(before, after)]
        print(f"{key}: before median {statistics.median(before):.2f}, after median {statistics.median(after):.2f}; "
              f"after vs before per round (above 1: after better) median {statistics.median(ratios):.2f}, "
              f"after better in {sum(x > 1 for x in ratios)} of {len(ratios)}")
    print(f"load average {min(loads):.1f} to {max(loads):.1f}; command: {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
