"""Publishing the destination manifest, last, once every shard's part is verified.

Shards run on different machines with their own journals, so which one is
last is decided at the destination itself: a shard whose objects are all
copied and verified writes a small done-marker
``DST/.stager/replicate/<run-id>/shard-<i>-of-<N>``, then looks for all N
markers. The shard that sees them all writes ``DST/.stager/manifest.parquet``
(the source manifest's bytes, atomically) and then removes the markers. Two
shards finishing together may both see all N: both write the same bytes, and
removing a marker twice is harmless. Object stores are read-after-write
consistent (S3 since 2020), so the last marker's writer always sees the others.

``stager replicate --finalize`` does the same from outside: it trusts the
objects of shards whose marker is present, checks the rest, and publishes.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from typing import Any

from ..config import SourceConfig
from ..errors import ShardNotFound
from ..manifest import MANIFEST_DIR, MANIFEST_PATH
from ..store import Store, UnsupportedOperation, open_store
from .shards import Shard

REPLICATE_DIR = f"{MANIFEST_DIR}/replicate"
_MARKER_RE = re.compile(r"^shard-(\d+)-of-(\d+)$")
#: Marker requests in flight when checking or removing N of them.
PARALLEL = 16


def marker_path(run_id: str, shard: Shard) -> str:
    return f"{REPLICATE_DIR}/{run_id}/shard-{shard.index}-of-{shard.count}"


async def write_marker(dst: Store, run_id: str, shard: Shard, info: dict[str, Any]) -> None:
    """Say at the destination that this shard's objects are all there, verified."""
    body = {"run_id": run_id, "shard": str(shard), "host": socket.gethostname(), "time": time.time(), **info}
    await dst.write(marker_path(run_id, shard), json.dumps(body, sort_keys=True).encode())


async def _each(count: int, fn) -> list:
    gate = asyncio.Semaphore(PARALLEL)

    async def one(i: int):
        async with gate:
            return await fn(i)

    return await asyncio.gather(*(one(i) for i in range(count)))


async def all_markers(dst: Store, run_id: str, count: int) -> bool:
    """Whether every shard of ``count`` has written its marker."""
    found = await _each(count, lambda i: dst.exists(marker_path(run_id, Shard(i, count))))
    return all(found)


async def publish(dst: Store, manifest_data: bytes, run_id: str, count: int) -> None:
    """Write the destination manifest, then remove the run's markers."""
    await dst.write(MANIFEST_PATH, manifest_data)
    await _each(count, lambda i: dst.delete(marker_path(run_id, Shard(i, count))))


async def finish_shard(dst: Store, manifest_data: bytes, run_id: str, shard: Shard, info: dict[str, Any]) -> bool:
    """Mark this shard done; publish the manifest if it is the last. Returns whether it published."""
    if shard.count == 1:
        await dst.write(MANIFEST_PATH, manifest_data)
        return True
    await write_marker(dst, run_id, shard, info)
    if not await all_markers(dst, run_id, shard.count):
        return False
    await publish(dst, manifest_data, run_id, shard.count)
    return True


async def present_markers(dst_config: SourceConfig, dst_url: str, run_id: str, **store_kwargs: Any) -> tuple[int, frozenset[int]]:
    """The shard count and the shards whose marker exists for ``run_id`` (0 and none if no marker).

    When markers of several shard counts exist (the replication was re-split), the
    count with the most markers wins.
    """
    sub = SourceConfig(f"{dst_url.rstrip('/')}/{REPLICATE_DIR}/{run_id}", dst_config.storage_options)
    store = open_store(sub, **store_kwargs)
    try:
        names = [o.path for o in await store.list()]
    except (ShardNotFound, UnsupportedOperation):
        names = []
    finally:
        await store.close()
    by_count: dict[int, set[int]] = {}
    for name in names:
        match = _MARKER_RE.match(name)
        if match and int(match.group(1)) < int(match.group(2)):
            by_count.setdefault(int(match.group(2)), set()).add(int(match.group(1)))
    if not by_count:
        return 0, frozenset()
    count = max(by_count, key=lambda n: (len(by_count[n]), n))
    return count, frozenset(by_count[count])
