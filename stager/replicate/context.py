"""What every replication run stands on: both sides' stores, its state directory and lock, its journal.

``Replicator.run`` (a whole copy) and ``watch_replicate`` (files as they become
complete) open the same things in the same order and close them in reverse:
:func:`open_replication` does it once for both, on the caller's exit stack.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import SourceConfig
from ..store import OriginStats, Store, open_store
from .journal import Journal
from .state import RunLock, state_dir_for

if TYPE_CHECKING:
    from .replicator import ReplicateConfig


@dataclass(frozen=True, slots=True)
class Replication:
    """The open parts of one run: the two sides, the state directory and the journal (its lock held)."""

    src: Store
    dst: Store
    state_dir: Path
    journal: Journal


async def open_replication(config: "ReplicateConfig", stack: AsyncExitStack, *, src_stats: OriginStats,
                           dst_stats: OriginStats) -> Replication:
    """Open both stores (S3 sides share one botocore session), take this shard's run lock in the state
    directory and open the journal; each is closed by ``stack``.

    Raises:
        ReplicationBusy: this shard is already running with this state directory.
        JournalError: the local state cannot be written.
    """
    kwargs = dict(retry=config.retry, bandwidth=config.bandwidth, concurrency=config.concurrency)
    src_config, dst_config = share_botocore_session(config.src, config.dst)
    src = open_store(src_config, stats=src_stats, **kwargs)
    stack.push_async_callback(src.close)
    dst = open_store(dst_config, stats=dst_stats, **kwargs)
    stack.push_async_callback(dst.close)
    state_dir = state_dir_for(src.url, dst.url, config.state_dir)
    lock = RunLock(state_dir, config.shard)
    stack.callback(lock.release)
    journal = Journal(state_dir / "journal.sqlite")
    stack.push_async_callback(journal.close)
    await journal.open()
    return Replication(src, dst, state_dir, journal)


def share_botocore_session(src: SourceConfig, dst: SourceConfig) -> tuple[SourceConfig, SourceConfig]:
    """Give two S3 sides that need botocore one aiobotocore session, so it parses its S3 model once.

    Each side keeps its own client, endpoint and credentials; a side that names a
    ``profile`` or brings its own ``session`` is left alone, and so is one whose
    endpoint and keys are given outright, which signs its requests itself and
    never loads botocore (:func:`~stager.store.s3_store.needs_botocore`).
    """
    from ..store.s3_store import needs_botocore

    def s3(config: SourceConfig) -> bool:
        return (config.url.split("://", 1)[0].lower() in ("s3", "s3a")
                and not {"session", "profile"} & set(config.storage_options)
                and needs_botocore(config.storage_options))

    if not (s3(src) and s3(dst)):
        return src, dst
    try:
        from aiobotocore.session import AioSession
    except ImportError:  # pragma: no cover - s3 extra missing: open_store reports it
        return src, dst
    session = AioSession()
    return (SourceConfig(src.url, {**src.storage_options, "session": session}),
            SourceConfig(dst.url, {**dst.storage_options, "session": session}))
