"""The manifest of ``stager stage``'s source, asked for on a thread while the engine's modules import.

How it works: most of stage's start-up was importing numpy, pyarrow and the
engine, none of which a request to the origin needs. So the command starts
this before importing them: a thread with its own event loop opens the
source's store (no numpy, no pyarrow) and sends a HEAD of the manifest at
once, which connects, signs and warms the connection, while pyarrow imports on
a second thread; then the manifest is loaded as everywhere else
(:func:`~stager.manifest.load_manifest`: verified and parsed inside the
store's retry loop) on the warm connection, while the main thread still
imports the engine. The session then takes the manifest it got. A load that
failed raises its error where the session's own load would have raised it,
with the same words; the HEAD's own answer is not used (an error there is
said again by the load), and a HEAD still waiting once pyarrow is in is
cancelled, so a slow origin is not waited for twice.

Only for remote sources: a local manifest is read in microseconds, and a
relative path is made absolute by the session.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import threading
from typing import TYPE_CHECKING

from ..config import RetryConfig, SourceConfig

if TYPE_CHECKING:
    from ..manifest import Manifest

#: :data:`stager.manifest.MANIFEST_PATH`, named without importing :mod:`stager.manifest` (and pyarrow with it).
MANIFEST_PATH = ".stager/manifest.parquet"
LOCAL_PROTOCOLS = ("", "file", "local")


class EarlyManifest:
    """The manifest of ``source``, loading on a thread from construction on."""

    def __init__(self, source: SourceConfig, retry: RetryConfig) -> None:
        self._source = source
        self._retry = retry
        self._future: concurrent.futures.Future[Manifest] = concurrent.futures.Future()
        threading.Thread(target=self._run, name="stager-manifest", daemon=True).start()

    @staticmethod
    def wanted(source: SourceConfig) -> bool:
        """Whether ``source`` is remote (its manifest worth asking for early)."""
        protocol = source.url.split("://", 1)[0].lower() if "://" in source.url else ""
        return protocol not in LOCAL_PROTOCOLS

    async def manifest(self) -> Manifest:
        """The manifest, once loaded.

        Raises:
            ManifestError, OriginError: as :func:`~stager.manifest.load_manifest`.
        """
        return await asyncio.wrap_future(self._future)

    def _run(self) -> None:
        try:
            self._future.set_result(asyncio.run(self._load()))
        except BaseException as exc:  # handed to the waiter, raised there
            self._future.set_exception(exc)

    async def _load(self) -> Manifest:
        from ..store import open_store

        store = open_store(self._source, retry=self._retry, concurrency=2)
        try:
            warm = asyncio.ensure_future(store.info(MANIFEST_PATH))
            load = await asyncio.to_thread(importlib.import_module, "stager.manifest.load")
            warm.cancel()
            with contextlib.suppress(BaseException):
                await warm
            return await load.load_manifest(store)
        finally:
            await store.close()
