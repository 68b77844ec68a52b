"""``stager checkpoints verify``: every store of a checkpoint read back against its manifest, and repaired.

The manifest is taken from the first store with a good one (the destination,
then the replicas given); it names every store. At each, every file is read
back and its blocks and whole digest compared with the manifest (a file
missing or of another size needs no read). A bad file is then sent again from
a store where it is good (:mod:`.transfer`: each block checked on the way
out, and the copy checked where it lands); DCP's ``.metadata`` and the
manifest go back last, so a store being repaired never looks complete before
it is. A file good nowhere is reported: nothing can bring it back.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from ..config import SourceConfig
from ..errors import ManifestError, OriginError
from ..store import Store, open_store
from .drain import publish
from .manifest import MANIFEST_PATH, CheckpointManifest, FileRecord
from .transfer import Sender, holds


@dataclass
class VerifyReport:
    """What verify found and did: per store, the files that were bad and whether they were repaired."""

    url: str
    stores: list[str] = field(default_factory=list)
    bad: dict[str, list[str]] = field(default_factory=dict)  # store -> files missing or damaged
    repaired: dict[str, list[str]] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)  # good at no store
    manifest_repaired: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.lost and all(set(self.bad.get(s, ())) <= set(self.repaired.get(s, ())) for s in self.stores)


async def verify_checkpoint(url: str, options_for: Callable[[str], dict], replicas: tuple[str, ...] = (),
                            repair: bool = True) -> VerifyReport:
    """Check (and repair, unless ``repair`` is false) every store of the checkpoint at ``url``.

    Raises:
        ManifestError: no store given has a good manifest.
        OriginError: a store failed as a whole.
    """
    url = url.rstrip("/")
    report = VerifyReport(url)
    async with AsyncExitStack() as stack:
        stores: dict[str, Store] = {}

        async def store(u: str) -> Store:
            if u not in stores:
                stores[u] = await stack.enter_async_context(open_store(SourceConfig(u, options_for(u))))
            return stores[u]

        manifest, manifest_ok = None, {}
        for candidate in (url, *[r.rstrip("/") for r in replicas]):
            try:
                manifest = CheckpointManifest.decode(await (await store(candidate)).read(MANIFEST_PATH),
                                                     f"{candidate}/{MANIFEST_PATH}")
                break
            except (OriginError, ManifestError):
                continue
        if manifest is None:
            raise ManifestError(f"{url}: no good checkpoint manifest at {', '.join((url, *replicas))}")
        report.stores = list(dict.fromkeys([*manifest.stores, *[r.rstrip('/') for r in replicas]]))
        body = manifest.encode()
        good: dict[str, set[str]] = {}
        for u in report.stores:
            s = await store(u)
            good[u] = {f.path for f in manifest.files if await holds(s, f, manifest.block_size)}
            report.bad[u] = sorted(f.path for f in manifest.files if f.path not in good[u])
            try:
                manifest_ok[u] = await s.read(MANIFEST_PATH) == body
            except OriginError:
                manifest_ok[u] = False
        if not repair:
            report.lost = sorted(f.path for f in manifest.files if not any(f.path in good[u] for u in report.stores))
            return report
        sender = Sender(manifest.block_size)
        order = manifest.data_files() + manifest.last_files()
        for u in report.stores:
            for record in order:
                if record.path in good[u]:
                    continue
                if await _repair(sender, stores, good, u, record):
                    report.repaired.setdefault(u, []).append(record.path)
                    good[u].add(record.path)
                elif record.path not in report.lost:
                    report.lost.append(record.path)
            if len(good[u]) == len(manifest.files) and (report.bad[u] or not manifest_ok[u]):
                await publish(stores[u], body)
                if not manifest_ok[u]:
                    report.manifest_repaired.append(u)
    return report


async def _repair(sender: Sender, stores: dict[str, Store], good: dict[str, set[str]], target: str,
                  record: FileRecord) -> bool:
    """Send ``record`` to ``target`` from a store where it is good; whether one was."""
    for source, files in good.items():
        if source == target or record.path not in files:
            continue
        try:
            await sender.send(stores[source], stores[target], record)
            return True
        except OriginError:
            continue
    return False
