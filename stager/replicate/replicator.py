"""One replication run: plan, copy, delete, publish.

:class:`Replicator` opens a store for each side (each with its own
:class:`~stager.store.OriginStats`, both under the bandwidth cap), takes the
source manifest (:mod:`.source`), builds the on-disk plan against the
destination (:mod:`.plan`), then copies this shard's objects with bounded
concurrency: a ``TaskGroup`` fed from the plan one batch at a time, a
semaphore on objects in flight and a byte budget on buffers
(:mod:`.budget`), so memory stays flat whatever the object count.

Errors that concern one object (gone from the source, bytes that never match
the manifest) are counted and reported, and the run goes on with the others;
errors that concern a whole side (down beyond the retry budget, access denied,
the destination bucket gone) stop the run at once. When the source manifest
is an index this tool made on the fly, an object whose bytes keep failing it
is hashed again and copied by the new digests (:mod:`.source`). Either way nothing is
published: the destination manifest is removed before the first change to
the destination and written again only when every object of every shard is
there and verified (:mod:`.finalize`), so a consumer never takes a half
copied dataset for a complete one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..config import RetryConfig, SourceConfig
from ..errors import (
    ConfigError,
    CorruptData,
    ManifestError,
    OriginChanged,
    ShardNotFound,
    first_error,
)
from ..manifest import MANIFEST_PATH, Manifest, ShardEntry, decode_manifest
from ..manifest.build import IndexConfig
from ..store import InvalidRange, ObjectInfo, OriginStats, Store
from .budget import ByteBudget
from .context import open_replication
from .copier import (
    DEFAULT_PART_SIZE,
    Copier,
    NotAtDestination,
    UploadLost,
    abort_upload,
    part_size_for,
)
from .finalize import finish_shard, present_markers, publish
from .journal import Journal
from .plan import Plan, PlanItem, PlanRules, PlanSummary
from .shards import Shard
from .source import keep_reindexed, read_manifest_bytes, reindex_object, source_manifest
from .stats import ReplicateStats

MiB = 1 << 20
#: S3 refuses parts (and single PUTs) larger than this.
MAX_PART_SIZE = 5 << 30
#: Errors that concern one object: counted, reported, and the run goes on.
PER_OBJECT = (ShardNotFound, CorruptData, InvalidRange, NotAtDestination, UploadLost)


@dataclass(frozen=True, slots=True)
class ReplicateConfig:
    """Everything one ``stager replicate`` run needs; built once at the edge (CLI or caller)."""

    src: SourceConfig
    dst: SourceConfig
    shard: Shard = Shard()
    state_dir: str | None = None
    dry_run: bool = False
    delete: bool = False
    trust_size: bool = False
    verify: bool = False
    finalize: bool = False  # only check and publish: copy nothing
    concurrency: int = 256  # the most requests in flight per side (the number adapts below it)
    part_size: int = DEFAULT_PART_SIZE
    buffer: int = 128 * MiB  # bytes held by transfers in flight
    bandwidth: int | None = None  # bytes/s, per side
    retry: RetryConfig = field(default_factory=RetryConfig)
    # For a source without a manifest: as `stager index` would (the same defaults), so a replica's
    # manifest describes token shards as the source's own would.
    index: IndexConfig = field(default_factory=IndexConfig)

    def __post_init__(self) -> None:
        if not 1 <= self.concurrency <= 4096:
            raise ConfigError(f"concurrency must be in 1..4096, got {self.concurrency}")
        if self.buffer < MiB:
            raise ConfigError(f"buffer must be at least 1MiB, got {self.buffer}")
        if not 0 < self.part_size <= MAX_PART_SIZE:
            raise ConfigError(f"part size must be in 1..{MAX_PART_SIZE} bytes (S3's largest part), got {self.part_size}")
        if self.bandwidth is not None and self.bandwidth <= 0:
            raise ConfigError(f"bandwidth must be > 0, got {self.bandwidth}")
        if self.finalize and self.shard.count != 1:
            raise ConfigError("--finalize runs once for all shards: do not give it --shard")
        if self.dst.url.split("://", 1)[0].lower() in ("http", "https"):
            raise ConfigError(f"{self.dst.url}: an HTTP server is read-only; it can only be a source")


class Replicator:
    """Runs one replication (see the module docstring); read :attr:`stats` while it runs."""

    def __init__(self, config: ReplicateConfig) -> None:
        self.config = config
        self.stats = ReplicateStats()
        self.src_stats = OriginStats()
        self.dst_stats = OriginStats()
        self.phase = "starting"
        self.plan_summary: PlanSummary | None = None
        self.copier: Copier | None = None  # set once copying starts (its gates show the adaptive concurrency)
        self._dst_had_manifest = False
        self._manifest_removed = False
        self._change_lock = asyncio.Lock()
        self._dst: Store | None = None
        self.block_size = 0
        #: Entries of an index of our own made again this run (see :mod:`.source`), by path.
        self.reindexed: dict[str, ShardEntry] = {}

    async def run(self) -> dict[str, Any]:
        """Replicate; return the summary (see :meth:`summary`).

        Raises:
            ManifestError: no usable source manifest.
            OriginError: a side failed as a whole (down, denied, bucket gone).
            ReplicationBusy: this shard is already running with this state directory.
            JournalError: the local state cannot be written.
        """
        cfg = self.config
        began = time.monotonic()
        async with AsyncExitStack() as stack:
            run = await open_replication(cfg, stack, src_stats=self.src_stats, dst_stats=self.dst_stats)
            src, dst, state, journal = run.src, run.dst, run.state_dir, run.journal
            self._dst = dst

            self.phase = "reading the source manifest"
            source = await source_manifest(src, state, allow_index=cfg.shard.count == 1, index=cfg.index)
            if source.indexed:
                self.phase = "indexed the source"
            manifest_data, run_id, block_size = source.data, source.run_id, source.manifest.block_size
            self.block_size = block_size

            self.phase = "listing the destination"
            dst_data = await read_manifest_bytes(dst)
            self._dst_had_manifest = dst_data is not None
            dst_manifest = self._decode_dst(dst, dst_data, manifest_data, source.manifest)
            rules = PlanRules(verify=cfg.verify, trust_size=cfg.trust_size, delete=cfg.delete)
            if cfg.finalize:
                count, trusted = await present_markers(cfg.dst, dst.url, run_id, retry=cfg.retry)
                if trusted:
                    rules = PlanRules(verify=cfg.verify, trust_size=cfg.trust_size, delete=cfg.delete,
                                      trusted_shards=trusted, trusted_count=count)
            plan = await Plan.build(state / f"plan-{cfg.shard.label}.sqlite", source.manifest, cfg.shard, rules,
                                    dst_pages=_pages(dst), dst_manifest=dst_manifest, journal_path=journal.path)
            stack.push_async_callback(plan.close)
            # The plan has what it needs, on disk; an index of our own is kept (as bytes) in case
            # one of its entries must be made again.
            own_index = replace(source, manifest=None) if source.indexed else None
            del source, dst_manifest
            self.plan_summary = plan.summary
            if cfg.dry_run:
                return self.summary(began, run_id, published=False, complete=False, dry=True,
                                    note=_dry_note(plan.summary, cfg))

            self.phase = "copying"
            await self._abort_stale_uploads(journal, plan, dst)
            copier = Copier(
                src, dst, journal, block_size=block_size, part_size=cfg.part_size,
                budget=ByteBudget(max(cfg.buffer, part_size_for(0, block_size, cfg.part_size))),
                stats=self.stats, verify_after=cfg.verify, before_change=self._before_change,
                copy=not cfg.finalize, concurrency=cfg.concurrency,
            )
            self.copier = copier
            await self._copy_all(plan, copier, src if own_index is not None else None)
            if self.reindexed:
                self.phase = "keeping the repaired index"
                fixed = await keep_reindexed(own_index, self.reindexed, f"{src.url}: index made on the fly")
                manifest_data, run_id = fixed.data, fixed.run_id
                del fixed
            if cfg.delete and not cfg.finalize:
                self.phase = "deleting"
                await self._delete_extras(plan, dst)

            published = False
            complete = False
            if self.stats.failed == 0:
                changed = self._manifest_removed or not self._dst_had_manifest or dst_data != manifest_data
                if not changed and cfg.shard.count == 1:
                    complete = True  # already a complete replica: nothing to publish
                    # (a shard still writes its marker: another shard may have changed things)
                elif cfg.finalize:
                    self.phase = "publishing"
                    await publish(dst, manifest_data, run_id, rules.trusted_count if rules.trusted_shards else 0)
                    published = complete = True
                else:
                    self.phase = "publishing"
                    published = complete = await finish_shard(dst, manifest_data, run_id, cfg.shard, {
                        "objects": self.stats.objects_done, "copied_bytes": self.stats.copied_bytes,
                    })
            self.phase = "done"
            return self.summary(began, run_id, published=published, complete=complete, dry=False)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- steps ---------------------------------------------------------------------------

    @staticmethod
    def _decode_dst(dst: Store, data: bytes | None, source_data: bytes, source: Manifest) -> Manifest | None:
        if data is None:
            return None
        if data == source_data:
            return source
        try:
            return decode_manifest(data, f"{dst.url}/{MANIFEST_PATH}")
        except ManifestError:
            return None  # unreadable: as if there were none (it is replaced at the end)

    async def _before_change(self) -> None:
        """Remove the destination manifest before the first change: it would describe other bytes."""
        if self._manifest_removed or not self._dst_had_manifest:
            return
        async with self._change_lock:
            if not self._manifest_removed:
                assert self._dst is not None
                await self._dst.delete(MANIFEST_PATH)
                self._manifest_removed = True

    async def _abort_stale_uploads(self, journal: Journal, plan: Plan, dst: Store) -> None:
        for record in await journal.uploads():
            if not await plan.wants(record.path, record.digest):
                await abort_upload(dst, record.path, record.part_size, record.token)
                await journal.forget(record.path)

    async def _copy_all(self, plan: Plan, copier: Copier, reindex_from: Store | None) -> None:
        """Copy (or check) every item of the plan; with ``reindex_from`` (the source, when its manifest
        is an index of our own), an object whose bytes keep failing it is hashed again and copied by that."""
        stats = self.stats
        slots = asyncio.Semaphore(max(8, 2 * self.config.concurrency))

        async def one(item: PlanItem) -> None:
            try:
                try:
                    await copier.replicate(item)
                except OriginChanged:
                    if reindex_from is None:
                        raise
                    fixed = await self._reindexed_item(reindex_from, item)
                    if fixed is None:  # hashed alike again: the index was right, the origin is not
                        raise
                    await copier.replicate(fixed)
            except PER_OBJECT as exc:
                stats.fail(str(exc))
            finally:
                slots.release()

        try:
            async with asyncio.TaskGroup() as tg:
                async for batch in plan.items():
                    for item in batch:
                        await slots.acquire()  # a bounded number of tasks alive, whatever the plan's size
                        tg.create_task(one(item))
        except BaseExceptionGroup as group:
            raise first_error(group) from None

    async def _reindexed_item(self, src: Store, item: PlanItem) -> PlanItem | None:
        """``item`` hashed again at the source, or None if its digest came out the same."""
        entry = await reindex_object(src, item.path, replace(self.config.index,
                                                                          block_size=self.block_size))
        if bytes.fromhex(entry.digest) == item.digest and entry.size == item.size:
            return None
        self.reindexed[item.path] = entry
        return PlanItem(item.path, entry.size, bytes.fromhex(entry.digest), np.asarray(entry.blocks, dtype="<u8"),
                        item.action)

    async def _delete_extras(self, plan: Plan, dst: Store) -> None:
        gate = asyncio.Semaphore(self.config.concurrency)

        async def one(path: str) -> None:
            async with gate:
                await self._before_change()
                await dst.delete(path)
                self.stats.deleted_objects += 1

        async for batch in plan.extras():
            try:
                async with asyncio.TaskGroup() as tg:
                    for path in batch:
                        tg.create_task(one(path))
            except BaseExceptionGroup as group:
                raise first_error(group) from None

    # -- reporting -----------------------------------------------------------------------

    def _concurrency_peaks(self) -> dict[str, int]:
        """The most requests each side had in flight at once (the adaptive limits' doing), and the most
        parts held at once (what a kill would have cost)."""
        if self.copier is None:
            return {"source": 0, "destination": 0, "parts_held": 0}
        return {"source": self.copier.read_gate.peak_holders, "destination": self.copier.write_gate.peak_holders,
                "parts_held": self.copier.part_gate.peak_holders}

    def summary(self, began: float, run_id: str, *, published: bool, complete: bool, dry: bool,
                note: str | None = None) -> dict[str, Any]:
        """The run's outcome as a JSON-able dict (what ``--json`` prints)."""
        cfg = self.config
        plan = self.plan_summary or PlanSummary()
        stats = self.stats
        seconds = time.monotonic() - began
        skipped, skipped_bytes = plan.to_skip
        result: dict[str, Any] = {
            "source": cfg.src.url,
            "destination": cfg.dst.url,
            "shard": str(cfg.shard),
            "run_id": run_id,
            "dry_run": dry,
            "delete": cfg.delete,
            "plan": plan.as_dict(),
            "objects": plan.objects,
            "bytes": plan.bytes,
            "copied_objects": stats.copied_objects,
            "copied_bytes": stats.copied_bytes,
            "resumed_bytes": stats.resumed_bytes,
            "checked_objects": stats.checked_objects,
            "checked_bytes": stats.checked_bytes,
            "check_mismatches": stats.check_mismatches,
            "skipped_objects": skipped,
            "skipped_bytes": skipped_bytes,
            "deleted_objects": stats.deleted_objects,
            "extra_objects": plan.extra_objects,
            "failed": stats.failed,
            "errors": list(stats.errors),
            "corrupt_blocks_rejected": stats.corrupt_blocks,
            "reindexed_objects": len(self.reindexed),
            "retries": {"source": self.src_stats.retries, "destination": self.dst_stats.retries},
            "concurrency_peak": self._concurrency_peaks(),
            "manifest_published": published,
            "complete": complete,
            "seconds": round(seconds, 3),
            "mb_per_s": round(stats.copied_bytes / 1e6 / seconds, 1) if seconds > 0 else 0.0,
        }
        if note:
            result["note"] = note
        return result


def _dry_note(plan: PlanSummary, cfg: ReplicateConfig) -> str | None:
    notes = []
    checks, check_bytes = plan.count(lambda a: a.name == "CHECK")
    if checks:
        notes.append(f"{checks} object(s) ({check_bytes:,} bytes) have the right size but nothing vouches for "
                     "them (no destination manifest lists them, no journal entry): they will be read and hashed "
                     "at the destination (--trust-size skips that)")
    if plan.extra_objects and not cfg.delete:
        notes.append(f"{plan.extra_objects} destination-only object(s) are kept (--delete removes them)")
    return "; ".join(notes) or None


async def _pages(store: Store) -> AsyncIterator[list[ObjectInfo]]:
    """The destination's listing; a destination that does not exist yet is empty."""
    try:
        async for page in store.scan():
            yield page
    except ShardNotFound:
        return
