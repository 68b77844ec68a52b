"""Helpers for the daemon tests: a corpus, `stager serve` and consumers as real processes.

Unix socket paths are limited to 107 bytes, so sockets live in short
directories under /tmp (`short_dir`), not in pytest's long tmp paths. Every
wait here is bounded by a deadline; every process started is killed at the
end by the owner that started it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from stager.daemon_client import probe
from stager.hashing import blob_digest
from stager.manifest import MANIFEST_PATH, Manifest
from stager.write import generate_corpus

REPO = Path(__file__).resolve().parents[2]


def short_dir() -> Path:
    """A fresh directory with a short path (for sockets); the caller removes it."""
    return Path(tempfile.mkdtemp(prefix="stg-", dir="/tmp"))


def remove_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class Corpus:
    root: Path
    manifest: Manifest

    @property
    def manifest_size(self) -> int:
        return (self.root / MANIFEST_PATH).stat().st_size

    def digest_of_file(self, index: int) -> str:
        return blob_digest((self.root / self.manifest.paths[index]).read_bytes())


def make_corpus(root: Path, *, shards: int = 16, tokens: int = 40_000, block_size: int = 16 * 1024,
                seed: int = 0) -> Corpus:
    """Token shards of ``tokens`` uint16 values each (blocks of ``block_size``) and their manifest."""
    manifest = generate_corpus(root, shards=shards, tokens_per_shard=tokens, seed=seed, block_size=block_size)
    return Corpus(root, manifest)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("STAGER_SOCKET", None)
    env.pop("STAGER_CONFIG", None)
    return env


def wait_until(condition, timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll ``condition()`` until true, at most ``timeout`` seconds (test helper: bounded)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class DaemonProcess:
    """``python -m stager serve`` in a child process."""

    def __init__(self, socket: Path, cache: Path, *, capacity: str = "1GB", args: Sequence[str] = (),
                 log: Path | None = None) -> None:
        self.socket = socket
        self.cache = cache
        self.capacity = capacity
        self.args = list(args)
        self.log = log or socket.with_name(socket.name + ".log")
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "stager", "serve", "--socket", str(self.socket), "--cache", str(self.cache),
                "--capacity", self.capacity, *self.args]

    def start(self, *, wait: bool = True, timeout: float = 60.0) -> "DaemonProcess":
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=_env(),
                                         cwd=REPO)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the daemon exited with {self.proc.returncode}:\n{self.output()}")
            health = probe(self.socket, timeout=1.0)
            if health is not None and health.get("pid") == self.proc.pid:
                return health
            time.sleep(0.05)
        raise AssertionError(f"the daemon did not answer within {timeout}s:\n{self.output()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers (idempotent)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-6000:]
        except OSError:
            return ""


class ConsumerProcess:
    """``tests/daemon/consumer_process.py`` in a child process; its stream is logged as JSON lines."""

    def __init__(self, out: Path, *, socket: Path, cache: Path, source: str, order: Sequence[int],
                 mode: str = "daemon", delay: float = 0.0, reconnect_timeout: float = 30.0,
                 window: int | None = None, capacity: int = 1 << 30) -> None:
        self.out = out
        self.argv = [sys.executable, "-m", "tests.daemon.consumer_process", "--out", str(out), "--socket", str(socket),
                     "--cache", str(cache), "--capacity", str(capacity), "--source", source,
                     "--order", ",".join(map(str, order)), "--mode", mode, "--delay", str(delay),
                     "--reconnect-timeout", str(reconnect_timeout)]
        if window is not None:
            self.argv += ["--window", str(window)]
        self.err = out.with_suffix(".err")
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ConsumerProcess":
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=err, env=_env(), cwd=REPO)
        return self

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"consumer {self.out.name} did not finish within {timeout}s:\n"
                                 f"{self.errors()}") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def records(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]

    def positions(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if "pos" in r]

    def summary(self) -> dict[str, Any]:
        done = [r for r in self.records() if r.get("done")]
        assert done, f"consumer {self.out.name} did not finish:\n{self.errors()}"
        return done[-1]

    def errors(self) -> str:
        try:
            return self.err.read_text(errors="replace")[-6000:]
        except OSError:
            return ""


def assert_stream(consumer: ConsumerProcess, corpus: Corpus, order: Sequence[int]) -> None:
    """The consumer read exactly ``order``, once each, in order, and every file had the manifest's bytes."""
    positions = consumer.positions()
    assert [r["pos"] for r in positions] == list(range(len(order))), consumer.errors()
    assert [r["index"] for r in positions] == list(order)
    for r in positions:
        assert r["digest"] == corpus.manifest.digest(r["index"]), f"position {r['pos']} read wrong bytes"
