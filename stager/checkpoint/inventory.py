"""What checkpoints a run's folder holds, and in what state at each of their stores.

A run's URL holds one folder per checkpoint (``run/step-100/``...). For each,
the manifest (at the destination, else at a replica found by name) lists its
stores; each store is then listed and judged against the manifest by names
and sizes (``verify`` reads the bytes):

- ``complete``: its manifest and every file, of the right size;
- ``damaged``: a manifest, but a file missing or of another size, or a
  manifest that does not check;
- ``draining``: files but no manifest yet (a drain under way, or killed);
- ``incomplete``: a save whose ranks are on several nodes, no manifest, and
  some node's part record not there yet (:mod:`.parts`): ``missing`` names
  each such node (part, host, ranks); a node that died before its part
  landed leaves its checkpoint so, never visible, until that node's drain
  runs again;
- ``staged``: only in this node's staging directory, sealed, not sent yet;
- ``missing``: nothing there.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..config import SourceConfig
from ..errors import ManifestError, OriginError, ShardNotFound
from ..store import Store, open_store
from .manifest import MANIFEST_PATH, CheckpointManifest
from .parts import PARTS_DIR, PartRecord
from .staging import StagingDir

STATES = ("staged", "draining", "incomplete", "complete", "damaged", "missing")
OptionsFor = Callable[[str], dict]


@dataclass
class CheckpointState:
    """One checkpoint of a run: its name, step, size, age and state at each store."""

    name: str
    url: str
    manifest: CheckpointManifest | None = None
    states: dict[str, str] = field(default_factory=dict)  # store URL -> state
    missing: dict[str, list[str]] = field(default_factory=dict)  # store URL -> nodes whose parts are not there

    @property
    def step(self) -> int | None:
        found = re.findall(r"\d+", self.name)
        return int(found[-1]) if found else None

    @property
    def size(self) -> int | None:
        return self.manifest.total_bytes if self.manifest is not None else None

    @property
    def age(self) -> float | None:
        return time.time() - self.manifest.created if self.manifest is not None else None

    @property
    def complete_everywhere(self) -> bool:
        return (self.manifest is not None and bool(self.states)
                and all(self.states.get(url) == "complete" for url in self.manifest.stores))


async def store_state(url: str, options: dict, manifest: CheckpointManifest | None) -> tuple[str, list[str]]:
    """The state of the checkpoint at ``url`` (see the module docstring), judged by listing, and the
    nodes whose parts are missing there (for ``incomplete``)."""
    try:
        async with open_store(SourceConfig(url, options)) as store:
            listing = {o.path: o.size for o in await store.list()}
            if MANIFEST_PATH not in listing:
                data = [p for p in listing if not p.startswith(".stager/")]
                missing = await _missing_parts(store, listing)
                if missing:
                    return "incomplete", missing
                return ("draining" if data else "missing"), []
            try:
                CheckpointManifest.decode(await store.read(MANIFEST_PATH), f"{url}/{MANIFEST_PATH}")
            except ManifestError:
                return "damaged", []
    except ShardNotFound:
        return "missing", []
    if manifest is None:
        return "damaged", []
    ok = all(listing.get(f.path) == f.size for f in manifest.files)
    return ("complete" if ok else "damaged"), []


async def _missing_parts(store: Store, listing: dict[str, int]) -> list[str]:
    """The nodes of the newest multi-node save at ``store`` whose part records are not there."""
    records: list[PartRecord] = []
    for path in sorted(p for p in listing if p.startswith(PARTS_DIR + "/")):
        try:
            records.append(PartRecord.decode(await store.read(path), f"{store.url}/{path}"))
        except (ManifestError, OriginError):
            continue  # damaged or gone: that node's part counts as missing
    if not records:
        return []
    newest = max(records, key=lambda r: r.created)
    landed = {r.part for r in records if r.save_id == newest.save_id}
    return [p.describe() for p in newest.layout if p.part not in landed]


async def read_manifest(url: str, options: dict) -> CheckpointManifest | None:
    """The checkpoint's manifest at ``url``; None if absent or damaged there."""
    try:
        async with open_store(SourceConfig(url, options)) as store:
            return CheckpointManifest.decode(await store.read(MANIFEST_PATH), f"{url}/{MANIFEST_PATH}")
    except (OriginError, ManifestError):
        return None


def _without_trailing_slash(url: str) -> str:
    """``url`` without the slashes it ends with, but never its scheme's: ``s3://`` made ``s3:``, a
    local directory of that name, which listed nothing, where the S3 store says the bucket is missing."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rstrip('/')}" if sep else (url.rstrip("/") or url)


async def list_checkpoints(run_url: str, options_for: OptionsFor, replicas: tuple[str, ...] = (),
                           staging: StagingDir | None = None) -> list[CheckpointState]:
    """Every checkpoint under ``run_url`` (and under each replica run URL given, and in ``staging``), by step.

    Raises:
        OriginError: the run's store cannot be listed.
    """
    run_url = _without_trailing_slash(run_url)
    names: set[str] = set()
    for root in (run_url, *replicas):
        try:
            async with open_store(SourceConfig(root, options_for(root))) as store:
                names.update(o.path.split("/", 1)[0] for o in await store.list() if "/" in o.path)
        except ShardNotFound:
            pass
    staged: dict[str, str] = {}
    if staging is not None:
        for entry in staging.entries():
            target = entry.spec().targets[0].url.rstrip("/")
            if target.rsplit("/", 1)[0] == run_url and entry.sealed_at is not None and not entry.drained:
                staged[target.rsplit("/", 1)[1]] = entry.name
    names.update(staged)
    out = []
    for name in sorted(names):
        url = f"{run_url}/{name}"
        state = CheckpointState(name, url)
        state.manifest = await read_manifest(url, options_for(url))
        for replica_root in replicas:
            if state.manifest is None:
                rurl = f"{replica_root.rstrip('/')}/{name}"
                state.manifest = await read_manifest(rurl, options_for(rurl))
        stores = (list(state.manifest.stores) if state.manifest is not None
                  else [url, *(f"{r.rstrip('/')}/{name}" for r in replicas)])
        for store_url in stores:
            state.states[store_url], missing = await store_state(store_url, options_for(store_url), state.manifest)
            if missing:
                state.missing[store_url] = missing
        if name in staged:
            state.states = {u: "staged" if s == "missing" else s for u, s in state.states.items()}
        out.append(state)
    return sorted(out, key=lambda s: (s.step is None, s.step or 0, s.name))
