"""The datasets the daemon holds: one per credential set and manifest version, each proven at the origin.

A consumer names a dataset by its source (URL and storage options) and by
the fingerprint of the manifest it loaded and validated itself. The daemon
keys what it holds by (access identity, fingerprint) (``identity.py``), so:

- a consumer is never served through another consumer's store: a new access
  identity (another key, a wrong key, no key, another endpoint) opens its own
  store with its own options and must read the manifest at the origin before
  it gets anything. A wrong key fails right there (``AccessDenied``); a
  bucket of the same name elsewhere has another manifest, which is refused.
  Every object fetched for a consumer's plans is then fetched through that
  consumer's own store, so nobody can make the daemon fetch with someone
  else's keys. Blobs stay shared by digest: their bytes are verified against
  the manifest either way.
- a dataset indexed again while consumers read it is simply a second
  version: a consumer that brings the new fingerprint gets the new manifest
  (as the origin now has it) with plans of its own, and consumers still on
  the old one keep theirs. A credential set new to the daemon whose
  consumer still holds an older manifest proves itself by reading the
  location's current manifest, and may then use the older version if the
  daemon still holds it for that location; otherwise it is told the version
  is gone (:class:`ManifestVersionGone`) and the session falls back to an
  engine of its own.

A version nobody uses (no plan, no request in flight) for ``idle`` seconds
is dropped and its store closed; coming back later proves the credentials
again. Credentials revoked at the origin stop working for anything not yet
in the cache at once (fetches use the consumer's own store), and for the
dataset itself once its version was idle for ``idle`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

from ..config import SourceConfig
from ..daemon_client.protocol import ManifestVersionGone, manifest_fingerprint
from ..engine import Dataset, Engine
from ..errors import StagerError
from ..manifest import Manifest
from .identity import SourceIdentities

log = logging.getLogger(__name__)


@dataclass(slots=True)
class HeldVersion:
    """One manifest version of a dataset, opened with one consumer's credentials."""

    dataset: Dataset
    fingerprint: str
    location: str
    last_used: float
    users: int = 0  # requests in flight that use it


class DatasetVersions:
    """Every dataset version the daemon holds, by (access identity, fingerprint).

    Args:
        engine: whose fetch settings and origin counters the stores share, and whose cache learns
            each version's blobs (for ``stager status``).
        idle: seconds after which a version without plans and requests is dropped.
    """

    def __init__(self, engine: Engine, *, idle: float, identities: SourceIdentities | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.idle = idle
        self.identities = identities or SourceIdentities()
        self._clock = clock
        self._held: dict[tuple[str, str], HeldVersion] = {}
        self._opening: dict[str, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._held)

    @contextlib.asynccontextmanager
    async def use(self, source: SourceConfig, fingerprint: str | None) -> AsyncIterator[tuple[Dataset, str]]:
        """The dataset version at ``source`` with manifest ``fingerprint`` (None: the origin's current one),
        opened with the source's own storage options, held while the block runs.

        Raises:
            OriginError: these options cannot read the manifest (``AccessDenied`` for bad keys).
            ManifestError: no valid manifest at the origin.
            ManifestVersionGone: the origin has another manifest and the daemon holds no such version.
            ConfigError: the source cannot be opened.
        """
        held = await self._open(source, fingerprint)
        held.users += 1
        try:
            yield held.dataset, held.fingerprint
        finally:
            held.users -= 1
            held.last_used = self._clock()

    async def _open(self, source: SourceConfig, fingerprint: str | None) -> HeldVersion:
        access = self.identities.access(source)
        async with self._lock(access):  # one proof per credential set, however many ask at once
            if fingerprint is not None and (held := self._held.get((access, fingerprint))) is not None:
                held.last_used = self._clock()
                return held
            return await self._prove(source, access, fingerprint)

    async def _prove(self, source: SourceConfig, access: str, wanted: str | None) -> HeldVersion:
        """Read the manifest at the origin with the consumer's own options, and hold what it proves."""
        try:
            dataset = await Dataset.open(source, self.engine.config, self.engine.origin_stats)
        except StagerError as exc:  # the message names the URL and the origin's answer, never an option's value
            log.info("refused dataset %s to storage options new to this daemon: %s: %s", source.url,
                     type(exc).__name__, exc)
            raise
        try:
            current = await self._fingerprint(dataset.manifest)
            location = self.identities.location(source)
            if wanted is None or wanted == current:
                known = self._held.get((access, current))
                if known is not None:  # asked without a fingerprint: the version is held already
                    await dataset.close()
                    known.last_used = self._clock()
                    return known
                return await self._hold(access, current, location, dataset)
            older = self._manifest(location, wanted)
            if older is None:
                raise ManifestVersionGone(
                    f"{dataset.name}: the consumer's manifest is not the one at the origin now (the dataset was "
                    "indexed again since it was loaded) and this daemon holds no such version any more; "
                    "open the dataset again to read the new one")
            return await self._hold(access, wanted, location, Dataset(source, dataset.store, older))
        except BaseException:
            await dataset.close()
            raise

    async def _hold(self, access: str, fingerprint: str, location: str, dataset: Dataset) -> HeldVersion:
        m = dataset.manifest
        if self._manifest(location, fingerprint) is None:  # a version new to the daemon: tell the cache
            await self.engine.in_disk_thread(self.engine.cache.register_dataset, dataset.name,
                                             [(m.digest(i), int(m.sizes[i])) for i in range(len(m))])
            log.info("opened dataset %s (manifest %s): %d shards, %d bytes", dataset.name, fingerprint, len(m),
                     m.total_bytes)
        held = HeldVersion(dataset, fingerprint, location, self._clock())
        self._held[(access, fingerprint)] = held
        return held

    def _manifest(self, location: str, fingerprint: str) -> Manifest | None:
        for held in self._held.values():
            if held.fingerprint == fingerprint and held.location == location:
                return held.dataset.manifest
        return None

    async def _fingerprint(self, manifest: Manifest) -> str:
        return await asyncio.get_running_loop().run_in_executor(None, manifest_fingerprint, manifest)

    @contextlib.asynccontextmanager
    async def _lock(self, access: str) -> AsyncIterator[None]:
        lock, count = self._opening.get(access, (asyncio.Lock(), 0))
        self._opening[access] = (lock, count + 1)
        try:
            async with lock:
                yield
        finally:
            lock, count = self._opening[access]
            if count == 1:
                del self._opening[access]  # no table that grows with every credential set ever tried
            else:
                self._opening[access] = (lock, count - 1)

    async def drop_idle(self, in_plans: Iterable[Dataset]) -> int:
        """Drop versions that neither a plan in ``in_plans`` nor a request in flight used for ``idle`` seconds."""
        busy = {id(d) for d in in_plans}
        now = self._clock()
        for held in self._held.values():
            if held.users or id(held.dataset) in busy:
                held.last_used = now  # a consumer between two epochs' plans finds its version still here
        gone = [key for key, held in self._held.items() if now - held.last_used > self.idle]
        for key in gone:
            held = self._held.pop(key)
            await held.dataset.close()
            log.info("dropped dataset %s (manifest %s): unused for %.0fs", held.dataset.name, held.fingerprint,
                     self.idle)
        return len(gone)

    async def close(self) -> None:
        """Close every store (the daemon stops)."""
        held, self._held = list(self._held.values()), {}
        for version in held:
            await version.dataset.close()
