"""A cluster of real `stager serve` processes on 127.0.0.2.., over `rclone serve s3` behind the fault proxy.

Each node has its own loopback address, peer port, socket and cache. Every
wait is bounded; every process started here is stopped (or killed) by
:meth:`Cluster.close`, called by the fixture that made the cluster.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import aiohttp

from stager.config import CacheConfig, FetchConfig, SourceConfig
from stager.session import RemoteSession
from stager.testing import FaultProxy
from stager.testing.s3server import free_port
from tests.daemon.support import REPO, Corpus, DaemonProcess, remove_dir, short_dir, wait_until

BUCKET = "data"
DATASET = f"s3://{BUCKET}/corpus"


def stager_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


@dataclass
class Node:
    host: str
    port: int
    work: Path
    daemon: DaemonProcess
    extra: list[str]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def cache(self) -> Path:
        return self.work / "cache"

    @property
    def socket(self) -> Path:
        return self.work / "d.sock"

    def blob(self, digest: str) -> Path:
        return self.cache / "blobs" / digest[:2] / digest

    def held_blocks(self, digest: str, blocks: int) -> set[int]:
        """The blocks of ``digest`` this node's cache holds verified now (read from its index)."""
        conn = sqlite3.connect(f"file:{self.cache / 'index.sqlite'}?mode=ro", uri=True, timeout=10)
        try:
            row = conn.execute("SELECT state FROM blobs WHERE digest = ?", (digest,)).fetchone()
            if row is not None and row[0] == 2:  # complete
                return set(range(blocks))
            return {idx for (idx,) in conn.execute("SELECT idx FROM verified_blocks WHERE digest = ?", (digest,))}
        finally:
            conn.close()

    def status(self) -> dict[str, Any]:
        """The daemon's own status (``/v1/status`` on its socket)."""
        async def ask() -> dict[str, Any]:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(self.socket))) as client:
                async with client.get("http://stager/v1/status", timeout=aiohttp.ClientTimeout(total=10)) as r:
                    return await r.json()

        return asyncio.run(ask())

    def cli_status(self) -> str:
        """What `stager status` prints for this node."""
        return subprocess.run([sys.executable, "-m", "stager", "status", "--cache", str(self.cache), "--socket",
                               str(self.socket)], capture_output=True, env=stager_env(), cwd=REPO, timeout=60,
                              check=True, text=True).stdout


@dataclass
class Cluster:
    corpus: Corpus
    proxy: FaultProxy
    keys: tuple[str, str]
    secret: Path
    nodes: list[Node] = field(default_factory=list)

    def add(self, host: str, *, extra: Sequence[str] = (), port: int | None = None) -> Node:
        """A node on ``host`` with its own port (``port``, or one free now), socket and cache (not started)."""
        work = short_dir()
        (work / "cache").mkdir()
        port = port or free_port(host)
        node = Node(host, port, work, DaemonProcess(work / "d.sock", work / "cache", args=()), list(extra))
        self.nodes.append(node)
        return node

    def spec(self) -> str:
        return ",".join(n.address for n in self.nodes)

    def start(self, *nodes: Node, spec: str | None = None, live: int | None = None) -> None:
        """Start the nodes' daemons at once and wait until each answers and sees ``live`` members live
        (default: every member of the spec)."""
        for node in nodes:
            node.daemon.args = ["--peer-listen", node.address, "--peers", spec or self.spec(),
                                "--peer-secret-file", str(self.secret), *node.extra]
            node.daemon.start(wait=False)
        for node in nodes:
            node.daemon.wait_ready()
        for node in nodes:
            self.wait_live(node, live or len(node.daemon.args[3].split(",")))

    def wait_live(self, node: Node, count: int, timeout: float = 20.0) -> None:
        """Until ``node`` counts ``count`` members live (its health checks run every 2 s)."""
        wait_until(lambda: len(node.status()["cluster"]["live"]) == count, timeout,
                   f"{node.address} to see {count} live members")

    def stage_everywhere(self, nodes: Sequence[Node] | None = None, timeout: float = 60.0) -> None:
        """Every shard of the dataset through each node's daemon at once, as consumers on those nodes would."""
        asyncio.run(self.stage_all(list(nodes or self.nodes), timeout))

    async def stage_all(self, nodes: list[Node], timeout: float, *, may_fail: Sequence[Node] = (),
                        read_after: asyncio.Event | None = None) -> None:
        """As :meth:`stage_everywhere`, in the caller's loop; the consumers of ``may_fail`` may fail. With
        ``read_after``, each consumer leaves its daemon to prefetch the dataset (its plan's window) and reads
        it, blocking on each shard in turn, only once that event is set."""
        async def stage(node: Node) -> None:
            session = RemoteSession(node.socket, CacheConfig(directory=node.cache), FetchConfig(), fallback=False,
                                    reconnect_timeout=1.0)  # a daemon killed on purpose is not waited for
            try:
                dataset = await session.open_dataset(self.source)
                plan = await session.plan(dataset, range(len(self.corpus.manifest)))
                if read_after is not None:
                    await read_after.wait()
                for position in range(len(self.corpus.manifest)):
                    await plan.ready(position)
                await plan.close()
            finally:
                await session.close()

        try:
            async with asyncio.timeout(timeout):
                results = await asyncio.gather(*(stage(n) for n in nodes), return_exceptions=True)
        except TimeoutError:
            raise AssertionError(f"staging did not end in {timeout}s:\n"
                                 + "\n".join(n.daemon.output()[-2000:] for n in nodes)) from None
        for node, result in zip(nodes, results, strict=True):
            if isinstance(result, BaseException) and node not in may_fail:
                raise AssertionError(f"staging on {node.address} failed: {result!r}\n{node.daemon.output()}") \
                    from result

    @property
    def source(self) -> SourceConfig:
        return SourceConfig(DATASET, {"endpoint_url": self.proxy.url, "key": self.keys[0], "secret": self.keys[1]})

    def assert_complete_and_exact(self, node: Node) -> None:
        m = self.corpus.manifest
        for i in range(len(m)):
            path = node.blob(m.digest(i))
            assert path.exists(), f"{node.address}: shard {i} not complete"
            assert path.read_bytes() == (self.corpus.root / m.paths[i]).read_bytes(), f"{node.address}: shard {i}"

    def close(self) -> None:
        for node in self.nodes:
            node.daemon.stop()
        for node in self.nodes:
            remove_dir(node.work)


def write_secret(directory: Path) -> Path:
    path = directory / "peer-secret"
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path
