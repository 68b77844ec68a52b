"""The plan: diff rules against a real destination folder, and memory that does not grow with the plan."""

from __future__ import annotations

import tracemalloc

import numpy as np

from stager.config import SourceConfig
from stager.manifest import Manifest, ShardEntry
from stager.replicate.journal import Journal
from stager.replicate.plan import Action, Plan, PlanRules
from stager.replicate.shards import Shard
from stager.store import ObjectInfo, open_store


def manifest_of(count: int, size: int = 100) -> Manifest:
    rng = np.random.default_rng(count)
    entries = [ShardEntry(f"d{i % 50}/obj-{i:07d}.bin", size, rng.bytes(16).hex(), (int(rng.integers(2**63)),))
               for i in range(count)]
    return Manifest.from_entries(entries, block_size=4096)


async def pages(objects: list[ObjectInfo]):
    for start in range(0, len(objects), 1000):
        yield objects[start:start + 1000]


async def test_each_rule_in_order(tmp_path):
    m = manifest_of(8)
    paths = m.paths
    digest = {p: bytes.fromhex(m.digest(i)) for i, p in enumerate(paths)}
    dst = [ObjectInfo(paths[1], 999),  # another size
           ObjectInfo(paths[2], 100), ObjectInfo(paths[3], 100), ObjectInfo(paths[4], 100),
           ObjectInfo(paths[5], 100), ObjectInfo("old/extra.bin", 5), ObjectInfo(".stager/manifest.parquet", 9)]
    dst_manifest = Manifest.from_entries([
        ShardEntry(paths[3], 100, m.digest(3), (1,)),  # same digest: vouched for
        ShardEntry(paths[4], 100, "00" * 16, (1,)),  # another digest
    ], block_size=4096)
    async with Journal(tmp_path / "journal.sqlite") as journal:
        await journal.open()
        await journal.record_done(paths[2], digest[paths[2]], 100)  # copied and verified by us
        async def plan_for(rules: PlanRules) -> dict[str, Action]:
            plan = await Plan.build(tmp_path / "plan.sqlite", m, Shard(), rules, dst_pages=pages(dst),
                                    dst_manifest=dst_manifest, journal_path=journal.path)
            try:
                found = {item.path: item.action async for batch in plan.items() for item in batch}
                extras = [p async for batch in plan.extras() for p in batch]
            finally:
                await plan.close()
            assert extras == ["old/extra.bin"]  # the manifest's own folder is never an extra
            return found

        work = await plan_for(PlanRules())
        assert work == {paths[0]: Action.COPY_MISSING, paths[1]: Action.COPY_SIZE, paths[4]: Action.COPY_DIGEST,
                        paths[5]: Action.CHECK, paths[6]: Action.COPY_MISSING, paths[7]: Action.COPY_MISSING}
        trusting = await plan_for(PlanRules(trust_size=True))
        assert paths[5] not in trusting and trusting[paths[4]] is Action.COPY_DIGEST
        verifying = await plan_for(PlanRules(verify=True))
        assert all(verifying[p] is Action.CHECK_VERIFY for p in paths[2:6])


async def test_shards_partition_the_plan(tmp_path):
    m = manifest_of(500)
    seen: list[str] = []
    async with Journal(tmp_path / "journal.sqlite") as journal:
        await journal.open()
        for i in range(3):
            plan = await Plan.build(tmp_path / f"plan-{i}.sqlite", m, Shard(i, 3), PlanRules(), dst_pages=pages([]),
                                    dst_manifest=None, journal_path=journal.path)
            mine = [item.path async for batch in plan.items() for item in batch]
            assert plan.summary.objects == len(mine) > 100  # this shard's objects only, about a third
            seen += mine
            await plan.close()
    assert sorted(seen) == sorted(m.paths)  # each object in exactly one shard


async def test_python_memory_does_not_grow_with_the_plan(tmp_path):
    """The plan lives in sqlite: building and walking it holds one batch of Python objects, not the plan."""
    async def peak(count: int) -> int:
        m = manifest_of(count)
        listing = [ObjectInfo(p, 100) for p in m.paths[: count // 2]]  # half of it already there
        store = open_store(SourceConfig(str(tmp_path / "empty")))
        async with Journal(tmp_path / f"j{count}.sqlite") as journal:
            await journal.open()
            tracemalloc.start()
            try:
                plan = await Plan.build(tmp_path / f"p{count}.sqlite", m, Shard(), PlanRules(),
                                        dst_pages=pages(listing), dst_manifest=None, journal_path=journal.path)
                seen = 0
                async for batch in plan.items():
                    seen += len(batch)
                await plan.close()
                # Only what the test itself holds (the listing) grows with the count.
                _, top = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        await store.close()
        assert seen == count
        return top

    small, large = await peak(3_000), await peak(30_000)
    assert large < small * 2 + (1 << 20), (small, large)  # ten times the objects, not ten times the memory
