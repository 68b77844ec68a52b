"""A dataset indexed again while the daemon runs: every manifest version its consumers bring is served.

``replicate --watch`` rewrites the destination's manifest every round, so
consumers that loaded the dataset before and after a round read different
manifests of one URL, through one daemon. Each must stream its own version,
correctly, without restarting the daemon and without falling back to an
engine of its own; a version nobody uses any more is dropped.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from stager.config import SourceConfig
from stager.daemon_client import manifest_fingerprint
from stager.errors import ManifestVersionGone
from stager.hashing import blob_digest
from stager.manifest import Manifest, save_manifest
from stager.manifest.build import IndexConfig, build_manifest
from stager.store import open_store
from stager.write import encode_shard


async def _index_again(root, old: Manifest) -> Manifest:
    """Shard 2 is replaced by a changed copy under a new name and one shard is added (the old files stay,
    as they do while replication runs); the manifest is rebuilt and saved over the old one."""
    changed = bytearray((root / old.paths[2]).read_bytes())
    changed[:64] = bytes(range(64))
    (root / "shard-changed.bin").write_bytes(bytes(changed))
    (root / "shard-added.bin").write_bytes(encode_shard(np.arange(30_000, dtype=np.uint16), "bin"))
    store = open_store(SourceConfig(str(root)))
    try:
        built = await build_manifest(store, IndexConfig(block_size=old.block_size))
        new = built.filter([path != old.paths[2] for path in built.paths])
        await save_manifest(store, new)
    finally:
        await store.close()
    assert len(new) == len(old) + 1
    return new


async def _stream(plan, manifest: Manifest, order, positions) -> None:
    for position in positions:
        path = await plan.ready(position)
        assert path.name == manifest.digest(order[position]), f"position {position}"
        assert blob_digest(path.read_bytes()) == manifest.digest(order[position]), f"position {position}: bytes"
        await plan.advance(position + 1)


async def _eventually(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def test_consumers_of_two_manifest_versions_stream_each_their_own(node):
    daemon = await node.start(lease=1.0)
    url = SourceConfig(node.proxy.url)
    old = node.corpus.manifest
    first = node.session(fallback=True)  # session="auto": falling back would hide a refusal, so it is checked
    dataset = await first.open_dataset(url)
    order_old = list(range(len(old)))
    plan_old = await first.plan(dataset, order_old)
    await _stream(plan_old, old, order_old, range(3))

    new = await _index_again(node.corpus.root, old)
    second = node.session(fallback=True)
    dataset_new = await second.open_dataset(url)
    assert dataset_new.manifest.digest(len(new) - 1) == new.digest(len(new) - 1), "the consumer read the new one"
    order_new = list(reversed(range(len(new))))
    plan_new = await second.plan(dataset_new, order_new)
    await _stream(plan_new, new, order_new, range(len(new)))
    await _stream(plan_old, old, order_old, range(3, len(old)))
    assert (first.mode, second.mode) == ("daemon", "daemon"), "both were served by the daemon"
    assert len(daemon.datasets) == 2

    # The old version goes once its last consumer leaves; the new one stays while it is used.
    await plan_old.close()
    await first.close()
    await _eventually(lambda: len(daemon.datasets) == 1, 10.0, "the old version to be dropped")
    assert [reg.fingerprint for reg in daemon.registry.plans()] == [manifest_fingerprint(new)]
    assert (await plan_new.ready(0)).name == new.digest(order_new[0])


async def test_a_version_the_daemon_no_longer_holds_falls_back_or_is_a_clear_error(node):
    await node.start()
    url = SourceConfig(node.proxy.url)
    old = node.corpus.manifest
    auto, strict = node.session(fallback=True, reconnect_timeout=1.0), node.session(reconnect_timeout=1.0)
    order = list(range(len(old)))
    plan_auto = await auto.plan(await auto.open_dataset(url), order)
    plan_strict = await strict.plan(await strict.open_dataset(url), order)
    await _stream(plan_auto, old, order, range(2))
    await _stream(plan_strict, old, order, range(2))

    await _index_again(node.corpus.root, old)
    await node.daemons[-1].stop()
    await node.start()  # a new daemon knows only the dataset's current manifest
    await _stream(plan_auto, old, order, range(2, len(old)))
    assert auto.mode == "embedded", "session='auto' goes on with an engine of its own"
    with pytest.raises(ManifestVersionGone, match="indexed again since it was loaded"):
        await plan_strict.advance(3)  # (its blobs are all in the cache by now: only a request asks the daemon)
