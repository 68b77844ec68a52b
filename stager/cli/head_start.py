"""The manifest's GET sent before the engine's modules are loaded, so the two overlap.

A staging run cannot ask for a shard before it has the manifest, and loading
what the engine needs (numpy, pyarrow, the cache and the engine: about a
quarter of a second) is most of a run's start-up. Nothing of that is needed to
send one GET: :class:`HeadStart` sends it with the store alone, the caller
loads the rest meanwhile (on a thread, while the loop waits for the answer),
and :meth:`HeadStart.manifest` then verifies and parses the bytes exactly as
:func:`stager.manifest.load_manifest` would. The GET is one attempt: if it
fails, or its bytes do not check out, the answer is None and the caller loads
the manifest the usual way, under the retry budget and with its usual errors.
That attempt is bounded by :data:`EARLY_TIMEOUT` (or the request timeout, if
shorter), so an origin that hangs on it delays the usual load by that much at
most, and a manifest that takes longer to download is read again by the usual
load (tens of megabytes on a slow link: a dataset of more than a million shards).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING

from ..config import FetchConfig, SourceConfig
from ..store import StoreOptions, open_store

if TYPE_CHECKING:
    from ..manifest import Manifest

log = logging.getLogger(__name__)

#: The manifest's path beside the data (``stager.manifest.MANIFEST_PATH``, checked equal by the tests;
#: importing it from there would load the manifest's parser, which is what this module runs ahead of).
MANIFEST_PATH = ".stager/manifest.parquet"
#: The longest the early GET may take, in seconds.
EARLY_TIMEOUT = 10.0


class HeadStart:
    """One GET of the manifest of ``source``, started at once (call inside the running loop)."""

    def __init__(self, source: SourceConfig, fetch: FetchConfig) -> None:
        retry = dataclasses.replace(fetch.retry, attempts=1,
                                    request_timeout=min(fetch.retry.request_timeout, EARLY_TIMEOUT))
        self._store = open_store(source, StoreOptions(retry=retry))
        self._read = asyncio.ensure_future(self._store.read(MANIFEST_PATH))
        self._closed = False

    async def manifest(self) -> "Manifest | None":
        """The manifest, verified and parsed; None if the GET failed or its bytes did not check out."""
        from ..manifest.load import manifest_from_bytes

        try:
            data = await self._read
            return await manifest_from_bytes(self._store.url, data)
        except Exception as exc:  # the usual load says what is wrong, after its retries
            log.debug("the manifest's first read did not do (%s); reading it again", exc)
            return None
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop the GET if it still runs, and close the store; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if not self._read.done():
            self._read.cancel()
        await asyncio.gather(self._read, return_exceptions=True)
        await self._store.close()
