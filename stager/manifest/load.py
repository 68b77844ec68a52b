"""Loading a manifest from a store: verified like a shard, inside the store's retry loop.

How it works: the bytes come from one ``read(..., check=...)`` of the
whole object. The check verifies the seal (:mod:`.seal`),
then parses; a body that fails the digest, is cut short, or (for a legacy
manifest, which has no digest) does not parse or validate, raises
:class:`~stager.errors.CorruptData`, so the store's
:class:`~stager.store.RetryPolicy` fetches it again with a block's backoff,
under the same budget as a block. A sealed manifest whose bytes match their
digest but whose entries are invalid fails at once: those are the bytes its
writer wrote, and no retry can change them. A manifest still wrong once the
budget is spent fails with one :class:`~stager.errors.ManifestError` naming
the file and what was wrong.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..errors import CorruptData, ManifestError, OriginError, OriginUnavailable, ShardNotFound
from .model import Manifest
from .parquet import parse_manifest
from .paths import MANIFEST_PATH
from .seal import check_seal

#: Manifests larger than this are hashed and parsed on a worker thread, off the event loop.
THREAD_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class LoadedManifest:
    """A manifest as read from a store, with its bytes and whether they carried their own digest."""

    manifest: Manifest
    data: bytes
    sealed: bool  # False: a legacy manifest, without a digest, judged by the structural checks alone


async def load_manifest(store) -> Manifest:  # store: stager.store.Store
    """Read, verify and validate the manifest beside the data of ``store``.

    Raises:
        ManifestError: there is none, or it is still corrupt or invalid after the store's
            retry budget (the message names the file and the problem).
        OriginError: the origin could not be read (after retries).
    """
    loaded = await load_manifest_data(store)
    assert loaded is not None
    return loaded.manifest


async def load_manifest_data(store, *, missing_ok: bool = False) -> LoadedManifest | None:
    """As :func:`load_manifest`, with the manifest's bytes; None if there is none and ``missing_ok``.

    One GET of the whole object (no size look-up first): the first request a staging run makes, so
    an origin 50 ms away costs it 50 ms, not 100; and the body is of one version of the manifest even
    if it is being rewritten.

    Raises:
        ManifestError, OriginError: as :func:`load_manifest`.
    """
    name = f"{store.url.rstrip('/')}/{MANIFEST_PATH}"
    reading = _Reading(name)
    try:
        data = await store.read(MANIFEST_PATH, check=reading.check)
    except CorruptData as exc:
        raise ManifestError(reading.failure()) from exc
    except OriginUnavailable as exc:
        if not reading.problem:
            raise _relocated(exc, store, name) from exc
        # The budget ran out on a timeout or a reset after bodies that failed the check:
        # the manifest is what the user must hear of.
        raise ManifestError(reading.failure(exc)) from exc
    except ShardNotFound as exc:
        if missing_ok:
            return None
        raise ManifestError(f"{name}: no manifest (run `stager index {store.url}` first)") from exc
    except OriginError as exc:  # a refusal or an origin that is down: say which URL, and where it was asked
        raise _relocated(exc, store, name) from exc
    assert reading.result is not None
    return LoadedManifest(reading.result, data, reading.sealed)


async def manifest_from_bytes(store_url: str, data: bytes) -> Manifest:
    """The manifest in ``data``, read whole from the store at ``store_url``, verified and parsed as a load
    verifies and parses each body it reads (:func:`load_manifest` and :class:`stager.cli.head_start.HeadStart`).

    Raises:
        CorruptData: a body a new read may fix (a digest mismatch, cut short).
        ManifestError: a sealed manifest whose entries are invalid.
    """
    reading = _Reading(f"{store_url.rstrip('/')}/{MANIFEST_PATH}")
    await reading.check(data)
    assert reading.result is not None
    return reading.result


def _relocated(exc: OriginError, store, name: str) -> OriginError:
    from ..store.translate import relocated

    return relocated(exc, MANIFEST_PATH, name, store.endpoint)


class _Reading:
    """The check of one manifest read: each attempt's body is verified and parsed, the last problem kept."""

    __slots__ = ("name", "attempts", "problem", "result", "sealed")

    def __init__(self, name: str) -> None:
        self.name = name
        self.attempts = 0
        self.problem = ""
        self.result: Manifest | None = None
        self.sealed = False

    async def check(self, data: bytes) -> None:
        """Verify and parse ``data``; raise CorruptData for a body that a new read may fix."""
        self.attempts += 1
        if len(data) > THREAD_BYTES:
            self.result, self.sealed = await asyncio.to_thread(self._judge, data)
        else:
            self.result, self.sealed = self._judge(data)

    def _judge(self, data: bytes) -> tuple[Manifest, bool]:
        try:
            sealed = check_seal(data, self.name)
        except ManifestError as exc:
            self.problem = str(exc)
            raise CorruptData(self.problem) from exc
        try:
            return parse_manifest(data, self.name, sealed=sealed), sealed
        except ManifestError as exc:
            if sealed:
                raise  # the bytes its writer wrote: reading them again cannot help
            # Legacy: nothing tells a body damaged in transit from a bad file, so read again.
            self.problem = str(exc)
            raise CorruptData(self.problem) from exc

    def failure(self, last: BaseException | None = None) -> str:
        """The one line for a manifest that never checked out (``last``: the error the budget ended on, if not that)."""
        problem = self.problem or f"{self.name}: the manifest could not be read intact"
        if last is not None:
            return f"{problem}; no read of it checked out within the retry budget (last error: {last})"
        return f"{problem}; still so after {self.attempts} read(s): the manifest on the origin is damaged"

    def __repr__(self) -> str:
        return f"_Reading({self.name!r}, attempts={self.attempts})"
