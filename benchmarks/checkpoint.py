"""Checkpoints: how long a save blocks the training loop, and how long until it is safe everywhere.

One state dict of float32 tensors (512 MB by default, ``--gb 2`` for the full
run) saved three ways, each in a fresh process (so its peak RSS is its own):

- (a) DCP's ``FileSystemWriter`` to local disk: the limit for a blocking save;
- (b) DCP's fsspec writer (s3fs) straight to S3, an ``rclone serve s3`` behind
  the fault proxy shaped by an origin profile of ``stager.testing`` (``near``
  by default: first-byte latency, a per-connection cap) and an aggregate cap
  per store (``--store-mbps``);
- (c) ``CheckpointWriter`` to the same kind of S3 with one replica (a second
  server, its own proxy and cap): the save returns on local disk; the drainer
  process sends it to both stores, verified.

Reported: the time the loop is blocked per save; for (b) and (c), the time
until the checkpoint is verified at every store (for (b): when save returns,
as nothing checks what landed), against the stores' capacity as shaped: the
same files sent to both stores at once, unverified, with the drain's part
size and concurrency (the proxy's own cost included); the peak RSS
of the saving process; then the time to load it back, (b) with DCP's fsspec
reader, (c) with ``CheckpointReader`` through a fresh cache (no staging copy:
as on another node).

Targets: (c) blocks <= 1.2x (a); (c) verified at both stores within 1.1x of
that capacity; (c)'s load <= (b)'s.

Run: ``.venv/bin/python benchmarks/checkpoint.py [--gb 2] [--profile near] [--store-mbps N]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import machine, table  # noqa: E402

MB = 1_000_000
TENSOR_BYTES = 32 << 20


def state_dict(gb: float) -> dict:
    import torch

    count = max(1, int(gb * 1e9) // TENSOR_BYTES)
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.rand(TENSOR_BYTES // 4, generator=g) for i in range(count)}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- children: one save or load each ---------------------------------------------------------------


def child(mode: str, config: dict) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp

    warnings.simplefilter("ignore")
    state = state_dict(config["gb"])
    threads = config["threads"]
    if mode == "local":
        writer = dcp.FileSystemWriter(config["local"], thread_count=threads)
    elif mode == "fsspec":
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        writer = FsspecWriter(config["dest_url"] + "/fsspec", thread_count=threads, **config["dest_options"])
    elif mode == "stager":
        from stager.checkpoint import CheckpointWriter

        url = config["dest_url"] + "/stager"
        writer = CheckpointWriter(url, staging_dir=config["staging"], replicas=[config["replica_url"] + "/stager"],
                                  storage_options=config["dest_options"],
                                  replica_options={config["replica_url"] + "/stager": config["replica_options"]},
                                  thread_count=threads, drain="process")
    elif mode == "stager-queued":  # staged and queued only: the "drain" child sends it
        from stager.checkpoint import CheckpointWriter

        url = config["dest_url"] + "/stager"
        writer = CheckpointWriter(url, staging_dir=config["staging"], replicas=[config["replica_url"] + "/stager"],
                                  storage_options=config["dest_options"],
                                  replica_options={config["replica_url"] + "/stager": config["replica_options"]},
                                  thread_count=threads, drain="none")
    elif mode == "drain":
        import asyncio

        from stager.checkpoint.drain import Drain
        from stager.checkpoint.staging import StagingDir

        began = time.monotonic()
        drained = asyncio.run(Drain(StagingDir(config["staging"])).run())
        return {"seconds": time.monotonic() - began, "drained": drained, "peak_rss_mb": peak_rss_mb()}
    elif mode == "raw":
        return raw_upload(config)
    elif mode in ("load-fsspec", "load-stager"):
        target = {k: torch.empty_like(v) for k, v in state.items()}
        began = time.monotonic()
        if mode == "load-fsspec":
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

            reader = FsspecReader(config["dest_url"] + "/fsspec", **config["dest_options"])
        else:
            from stager.checkpoint import CheckpointReader

            reader = CheckpointReader(config["dest_url"] + "/stager", cache_dir=config["cache"],
                                      storage_options=config["dest_options"], session_mode="embedded")
        dcp.load(target, storage_reader=reader)
        took = time.monotonic() - began
        assert all(torch.equal(target[k], state[k]) for k in state), "loaded tensors differ"
        return {"seconds": took, "peak_rss_mb": peak_rss_mb()}
    else:
        raise SystemExit(f"unknown mode {mode}")
    rss_before = peak_rss_mb()
    started = time.time()
    began = time.monotonic()
    dcp.save(state, storage_writer=writer)
    took = time.monotonic() - began
    return {"seconds": took, "started": started, "peak_rss_mb": peak_rss_mb(), "rss_before_save_mb": rss_before}


def raw_upload(config: dict) -> dict:
    """The stores' capacity as the proxies shape it, through the drain's own transport: the staged files sent
    to both stores at once in multipart uploads of the drain's part size, as many parts in flight as the
    drain allows in all, with nothing verified (no read back, no MD5, no journal)."""
    import asyncio

    from stager.checkpoint.transfer import DEFAULT_PART_SIZE
    from stager.config import SourceConfig
    from stager.store import open_store

    in_flight = 8  # the drain's default: one Sender, shared by every store
    files = {p.name: p.read_bytes() for p in sorted(Path(config["raw_from"]).iterdir()) if p.is_file()}
    slots = None

    async def send(store, name: str, data: bytes) -> None:
        if len(data) <= DEFAULT_PART_SIZE:
            async with slots:
                await store.write(name, data)
            return
        upload = await store.open_upload(name, part_size=DEFAULT_PART_SIZE)

        async def part(number: int) -> None:
            async with slots:
                start = (number - 1) * DEFAULT_PART_SIZE
                await upload.write_part(number, data[start:start + DEFAULT_PART_SIZE])

        await asyncio.gather(*(part(n) for n in range(1, -(-len(data) // DEFAULT_PART_SIZE) + 1)))
        await upload.complete()

    async def one_store(url: str, options: dict) -> None:
        async with open_store(SourceConfig(url, options), concurrency=in_flight) as store:
            await asyncio.gather(*(send(store, n, d) for n, d in files.items() if n != ".metadata"))
            await send(store, ".metadata", files[".metadata"])  # last, as the drain publishes it

    async def both() -> None:
        nonlocal slots
        slots = asyncio.Semaphore(in_flight)
        await asyncio.gather(one_store(config["dest_url"] + "/raw", config["dest_options"]),
                             one_store(config["replica_url"] + "/raw", config["replica_options"]))

    began = time.monotonic()
    asyncio.run(both())
    return {"seconds": time.monotonic() - began, "peak_rss_mb": peak_rss_mb()}


def run_child(mode: str, config: dict, work: Path, *, may_fail: bool = False) -> dict:
    path = work / f"{mode}.json"
    path.write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                       os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(path)], capture_output=True, text=True,
                         env=env, timeout=7200)
    if out.returncode != 0:
        if may_fail:
            return {"seconds": None, "error": out.stderr.strip().splitlines()[-1][:300]}
        raise SystemExit(f"{mode} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the run ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=0.5, help="state dict size in GB (default 0.5; 2 for the full run)")
    parser.add_argument("--profile", default="near", help="origin profile of both stores (stager.testing.PROFILES)")
    parser.add_argument("--store-mbps", type=float, default=None,
                        help="an aggregate cap per store, MB/s (default none: the profile's per-connection cap)")
    parser.add_argument("--threads", type=int, default=4, help="DCP writer threads (files per rank)")
    parser.add_argument("--work", type=Path, default=None, help="work directory (default: a temporary one)")
    parser.add_argument("--drain-only", action="store_true",
                        help="only (c) staged, then its drain alone against the raw upload (no DCP writers, no loads)")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], json.loads(Path(args.child[1]).read_text()))))
        return

    from stager.testing import FaultProxy, S3Server, object_store_plan

    work = args.work or Path(tempfile.mkdtemp(prefix="stager-ckpt-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    dest = S3Server(work / "dest" / "root", access_key="benchdest" + "d" * 8, secret_key="destsecret" + "s" * 16)
    replica = S3Server(work / "replica" / "root", access_key="benchrepl" + "r" * 8,
                       secret_key="replsecret" + "s" * 16)
    plan = dict(bandwidth_bps=args.store_mbps * MB if args.store_mbps else None, methods=("GET", "PUT", "POST", "HEAD"))
    try:
        with dest, replica:
            dest.make_bucket("ckpt")
            replica.make_bucket("ckpt")
            with FaultProxy(dest.endpoint_url, object_store_plan(args.profile, **plan),
                            credentials=dest.credentials) as dproxy, \
                    FaultProxy(replica.endpoint_url, object_store_plan(args.profile, **plan),
                               credentials=replica.credentials) as rproxy:
                config = {"gb": args.gb, "threads": args.threads, "local": str(work / "local"),
                          "staging": str(work / "staging"), "cache": str(work / "cache"),
                          "dest_url": "s3://ckpt/run", "dest_options": dest.storage_options(dproxy.url),
                          "replica_url": "s3://ckpt/run", "replica_options": replica.storage_options(rproxy.url)}
                if args.drain_only:
                    results = measure_drain(config, work)
                else:
                    results = measure(config, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.drain_only:
        d, raw = results["drain"], results["raw"]
        print(machine())
        print(f"state dict: {results['bytes'] / MB:.0f} MB; profile {args.profile}; the drain alone (its own process, "
              f"started once the save returned): {d['seconds']:.2f} s; raw upload to both: {raw['seconds']:.2f} s; "
              f"drain / raw: {d['seconds'] / raw['seconds']:.2f}x (target <= 1.1x)")
        return
    report(args, results)


def measure_drain(config: dict, work: Path) -> dict:
    """(c)'s save, queued; then its drain alone, timed in a process of its own; then the raw upload."""
    from stager.checkpoint.staging import StagingDir

    out: dict = {"stager": run_child("stager-queued", config, work)}
    out["drain"] = run_child("drain", config, work)
    entry = StagingDir(config["staging"]).entry(config["dest_url"] + "/stager")
    if not entry.drained:
        raise SystemExit("the drain ended without the checkpoint verified at every store")
    out["bytes"] = sum(p.stat().st_size for p in entry.path.iterdir() if p.is_file())
    out["raw"] = run_child("raw", {**config, "raw_from": str(entry.path)}, work)
    return out


def measure(config: dict, work: Path) -> dict:
    from stager.checkpoint.staging import StagingDir

    out: dict = {}
    out["local"] = run_child("local", config, work)
    out["fsspec"] = run_child("fsspec", config, work)
    out["stager"] = run_child("stager", config, work)
    entry = StagingDir(config["staging"]).entry(config["dest_url"] + "/stager")
    deadline = time.monotonic() + 7200
    while not entry.drained and time.monotonic() < deadline:  # bounded: the drainer process finishes it
        time.sleep(0.05)
    out["stager"]["verified_s"] = time.time() - out["stager"]["started"]  # from the moment save began
    out["stager"]["drained"] = entry.drained
    out["bytes"] = sum(p.stat().st_size for p in entry.path.iterdir() if p.is_file())
    out["raw"] = run_child("raw", {**config, "raw_from": str(entry.path)}, work)
    # DCP's fsspec writer does not check what landed: a file lost on the way makes its load fail
    out["load-fsspec"] = run_child("load-fsspec", config, work, may_fail=True)
    out["load-stager"] = run_child("load-stager", config, work)
    return out


def report(args: argparse.Namespace, r: dict) -> None:
    size = r["bytes"]
    capacity = r["raw"]["seconds"]  # the same bytes sent to both stores at once, unverified
    a, b, c = r["local"], r["fsspec"], r["stager"]
    b_load = r["load-fsspec"]["seconds"]
    b_load_text = f"{b_load:.2f}" if b_load is not None else "failed"
    rows = [
        ["(a) FileSystemWriter, local disk", f"{a['seconds']:.2f}", "-", f"{a['peak_rss_mb']:.0f}", "-"],
        ["(b) DCP fsspec writer, S3", f"{b['seconds']:.2f}", f"{b['seconds']:.2f} (unverified, 1 store)",
         f"{b['peak_rss_mb']:.0f}", b_load_text],
        ["(c) CheckpointWriter, S3 + replica", f"{c['seconds']:.2f}", f"{c['verified_s']:.2f} (2 stores)",
         f"{c['peak_rss_mb']:.0f}", f"{r['load-stager']['seconds']:.2f}"],
        ["    capacity: raw parallel upload", "-", f"{capacity:.2f} (2 stores, unverified)",
         f"{r['raw']['peak_rss_mb']:.0f}", "-"],
    ]
    cap = f", {args.store_mbps:.0f} MB/s per store" if args.store_mbps else ""
    print(machine())
    print(f"state dict: {size / MB:.0f} MB; stores: rclone serve s3 behind the proxy, profile {args.profile}{cap}")
    print(table(rows, ["save", "blocked s", "verified everywhere s", "peak RSS MB", "load s"]))
    print(f"(c) blocked / (a) blocked: {c['seconds'] / a['seconds']:.2f}x (target <= 1.2x)")
    drain = c["verified_s"] - c["seconds"]  # from save's return (the files exist) to verified at both
    print(f"(c) drain (save's return to verified at both, {drain:.2f} s) / raw upload to both: "
          f"{drain / capacity:.2f}x (target <= 1.1x); from the start of the save: {c['verified_s'] / capacity:.2f}x")
    if b_load is not None:
        print(f"(c) load / (b) load: {r['load-stager']['seconds'] / b_load:.2f}x (target <= 1.0x)")
    else:
        print(f"(b) load failed: {r['load-fsspec']['error']}")


if __name__ == "__main__":
    main()
