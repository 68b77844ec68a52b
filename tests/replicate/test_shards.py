"""Four shards of one replication as four real processes at once, and ``--finalize``."""

from __future__ import annotations

import asyncio
import json

from stager.manifest import MANIFEST_PATH
from stager.replicate import ReplicateConfig, Replicator, Shard
from stager.replicate.finalize import REPLICATE_DIR
from stager.replicate.shards import assign_shards
from tests.cli.runner import start

from .dataset import FAST_RETRY, MiB, assert_replica, flags, mixed_files, write_dataset


def args(a, b, state, *extra: str) -> list[str]:
    return ["replicate", a.url("ds"), b.url("copy"), *flags("-s", a.options()), *flags("-d", b.options()),
            "--state-dir", str(state), "--part-size", "5MiB", "--concurrency", "4", "--json", *extra]


def test_four_shards_in_parallel_make_one_complete_copy_and_one_manifest(clusters, tmp_path):
    a, b = clusters
    manifest = write_dataset(a.root / "ds", mixed_files(seed=12, large=(7 * MiB, 6 * MiB, 5 * MiB + 1), small=40))
    # Each shard learns its place the way its scheduler would tell it, and keeps its own state,
    # as if on its own machine.
    ways = [
        ({}, ["--shard", "0/4"]),
        ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0"}, []),
        ({"JOB_COMPLETION_INDEX": "2", "STAGER_SHARD_COUNT": "4"}, []),
        ({"STAGER_SHARD": "3/4"}, []),
    ]
    procs = [start(args(a, b, tmp_path / f"node{i}", *extra), env=env) for i, (env, extra) in enumerate(ways)]
    summaries = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        summaries.append(json.loads(out))
    assert sorted(s["shard"] for s in summaries) == ["0/4", "1/4", "2/4", "3/4"]
    assert sum(s["copied_objects"] for s in summaries) == len(manifest)  # each object copied once
    assert sum(s["copied_bytes"] for s in summaries) == manifest.total_bytes
    assert all(s["objects"] > 0 for s in summaries)
    assert any(s["manifest_published"] for s in summaries)
    assert_replica(a.root / "ds", b.root / "copy")  # one manifest, the source's; markers cleaned up

    async def rerun(i: int) -> dict:  # in-process: the same code, without four more start-ups
        return await Replicator(ReplicateConfig(a.source("ds"), b.source("copy"), shard=Shard(i, 4),
                                                state_dir=str(tmp_path / f"node{i}"), retry=FAST_RETRY)).run()

    again = [asyncio.run(rerun(i)) for i in range(4)]
    assert sum(s["copied_bytes"] for s in again) == 0 and all(s["failed"] == 0 for s in again)
    assert_replica(a.root / "ds", b.root / "copy")


async def test_finalize_trusts_marked_shards_checks_the_rest_and_publishes(clusters, tmp_path):
    a, b = clusters
    manifest = write_dataset(a.root / "ds", mixed_files(seed=13, large=(6 * MiB,), small=20))

    def config(node: str, **kwargs) -> ReplicateConfig:
        return ReplicateConfig(a.source("ds"), b.source("copy"), state_dir=str(tmp_path / node), retry=FAST_RETRY,
                               part_size=5 * MiB, concurrency=4, **kwargs)

    for i in (0, 1):
        summary = await Replicator(config(f"node{i}", shard=Shard(i, 3))).run()
        assert not summary["manifest_published"]  # shard 2 has not reported
    markers = b.root / "copy" / REPLICATE_DIR / summary["run_id"]
    assert sorted(p.name for p in markers.iterdir()) == ["shard-0-of-3", "shard-1-of-3"]

    missing = await Replicator(config("fin", finalize=True)).run()
    assert missing["failed"] > 0 and "missing at the destination" in missing["errors"][0]
    assert not missing["manifest_published"] and not (b.root / "copy" / MANIFEST_PATH).exists()

    # Shard 2's objects arrive some other way (its node died before writing its marker).
    owners = assign_shards(manifest.sizes, 3)
    theirs = [manifest.paths[i] for i in range(len(manifest)) if owners[i] == 2]
    for path in theirs:
        (b.root / "copy" / path).parent.mkdir(parents=True, exist_ok=True)
        (b.root / "copy" / path).write_bytes((a.root / "ds" / path).read_bytes())
    victim = b.root / "copy" / next(p for p in theirs if (a.root / "ds" / p).stat().st_size)
    good = victim.read_bytes()
    victim.write_bytes(bytes(len(good)))  # right size, wrong bytes
    damaged = await Replicator(config("fin", finalize=True)).run()
    assert damaged["failed"] == 1 and "differs from the source manifest" in damaged["errors"][0]
    assert not (b.root / "copy" / MANIFEST_PATH).exists()

    victim.write_bytes(good)
    finished = await Replicator(config("fin", finalize=True)).run()
    assert finished["manifest_published"] and finished["copied_bytes"] == 0
    # The unmarked shard's objects were read: all but the victim by the failed attempt (and journaled).
    assert finished["checked_objects"] == 1
    actions = finished["plan"]["actions"]
    assert actions["skip_marker"]["objects"] == len(manifest) - len(theirs)
    assert actions["skip_journal"]["objects"] == len(theirs) - 1
    assert_replica(a.root / "ds", b.root / "copy")
