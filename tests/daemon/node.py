"""Fixtures: an in-process daemon on the test's event loop, in front of a real HTTP origin behind the fault proxy.

Imported by tests/daemon/conftest.py and by tests/session/test_remote.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from stager.config import CacheConfig, FetchConfig, RetryConfig
from stager.daemon import Daemon, DaemonConfig
from stager.daemon_client.protocol import CONSUMER_KEY_HEADER
from stager.session import RemoteSession
from stager.testing import FaultProxy
from tests.daemon.support import Corpus, make_corpus, remove_dir, short_dir

CONSUMER_KEY = "raw-test-consumer-key-0001"
FAST_RETRY = RetryConfig(attempts=4, backoff_base=0.01, backoff_max=0.05, deadline=2.0, request_timeout=2.0)


@dataclass
class Node:
    """A corpus, its origin (behind ``proxy``), a short directory for the socket, and the cache."""

    corpus: Corpus
    proxy: FaultProxy
    work: Path
    capacity: int = 1 << 30
    daemons: list[Daemon] = field(default_factory=list)
    sessions: list[RemoteSession] = field(default_factory=list)

    @property
    def socket(self) -> Path:
        return self.work / "d.sock"

    @property
    def cache(self) -> CacheConfig:
        return CacheConfig(directory=self.work / "cache", capacity=self.capacity)

    async def start(self, fetch: FetchConfig | None = None, **settings: Any) -> Daemon:
        settings.setdefault("lease", 60.0)
        daemon = Daemon(DaemonConfig(socket=self.socket, **settings), self.cache,
                        fetch or FetchConfig(concurrency=4, hedge=False, retry=FAST_RETRY))
        await daemon.start()
        self.daemons.append(daemon)
        return daemon

    def session(self, **kwargs: Any) -> RemoteSession:
        kwargs.setdefault("fallback", False)
        kwargs.setdefault("reconnect_timeout", 5.0)
        session = RemoteSession(self.socket, self.cache, FetchConfig(concurrency=4, retry=FAST_RETRY), **kwargs)
        self.sessions.append(session)
        return session

    async def raw(self, method: str, path: str, *, consumer_key: str | None = CONSUMER_KEY,
                  **kwargs: Any) -> tuple[int, Any]:
        """One request as any client could send it (with ``consumer_key`` in its header unless None);
        the status and the decoded JSON (or text)."""
        if consumer_key is not None:
            kwargs["headers"] = {CONSUMER_KEY_HEADER: consumer_key, **kwargs.get("headers", {})}
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(self.socket))) as client:
            async with client.request(method, f"http://stager{path}", **kwargs) as response:
                text = await response.text()
                try:
                    import json

                    return response.status, json.loads(text)
                except ValueError:
                    return response.status, text


@pytest.fixture
def corpus(tmp_path) -> Corpus:
    return make_corpus(tmp_path / "corpus", shards=8, tokens=40_000, block_size=16 * 1024)


@pytest.fixture
async def node(corpus, http_origin_factory, fault_proxy):
    work = short_dir()
    (work / "cache").mkdir()
    n = Node(corpus, fault_proxy(http_origin_factory(corpus.root)), work)
    try:
        yield n
    finally:
        for session in n.sessions:
            await session.close()
        for daemon in reversed(n.daemons):
            await daemon.stop()
        remove_dir(work)
