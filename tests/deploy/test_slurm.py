"""The Slurm prolog and epilog, run by hand as slurmd would, start and stop real daemons that find each other.

Two fake nodes of one job live on this machine: each has its own run and cache directories and
its own loopback address (127.0.0.2 and 127.0.0.3, one port for both, as `--peers slurm` wants),
given to the scripts through their overrides (STAGER_PEER_LISTEN and the directories);
SLURM_JOB_NODELIST names the two addresses. Every wait is bounded; every daemon a test started
is stopped by its pid at the end if the epilog did not stop it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.daemon.support import make_corpus
from tests.deploy.manifests import REPO

SLURM = REPO / "deploy" / "slurm"
JOB = "4242"
ADDRESSES = ("127.0.0.2", "127.0.0.3")
ATTEMPTS = 3


def _free_port(hosts: tuple[str, ...]) -> int:
    """A port free on every one of ``hosts`` (the peer port is the same on every node of a job)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind((hosts[0], 0))
            port = first.getsockname()[1]
            others = []
            try:
                for host in hosts[1:]:
                    other = socket.socket()
                    others.append(other)
                    other.bind((host, port))
                return port
            except OSError:
                continue
            finally:
                for other in others:
                    other.close()
    raise AssertionError("no port free on every test address")


class FakeNode:
    """One node of the fake job: the environment slurmd would give its prolog, plus the test's overrides."""

    def __init__(self, base: Path, name: str, address: str, port: int, site_secret: Path, stager: Path) -> None:
        self.address, self.port = address, port
        self.root = base / name
        self.run_root = self.root / "run"
        self.cache_root = self.root / "cache"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("STAGER_", "SLURM_"))}
        env.update({
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "SLURM_JOB_ID": JOB,
            "SLURM_JOB_NODELIST": ",".join(ADDRESSES),
            "STAGER": str(stager),
            "STAGER_RUN_ROOT": str(self.run_root),
            "STAGER_CACHE_ROOT": str(self.cache_root),
            "STAGER_PEER_PORT": str(port),
            "STAGER_PEER_LISTEN": f"{address}:{port}",
            "STAGER_SITE_SECRET_FILE": str(site_secret),
            "STAGER_PROLOG_STRICT": "1",
            "STAGER_START_TIMEOUT": "60",
            "STAGER_STOP_TIMEOUT": "30",
            "STAGER_CAPACITY": "256MB",
        })
        self.env = env

    @property
    def run_dir(self) -> Path:
        return self.run_root / JOB

    @property
    def socket(self) -> Path:
        return self.run_dir / "socket" / "stager.sock"

    @property
    def cache(self) -> Path:
        user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True, timeout=10).stdout.strip()
        return self.cache_root / user

    @property
    def member(self) -> str:
        return f"{self.address}:{self.port}"

    def script(self, name: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(SLURM / name)], capture_output=True, text=True, timeout=150,
                              env={**self.env, **extra}, stdin=subprocess.DEVNULL)

    def stage(self, url: str, options: dict[str, str]) -> dict[str, Any]:
        """`stager stage` through this node's daemon (the socket the task prolog would give the job)."""
        flags = [flag for key, value in options.items() for flag in ("-o", f"{key}={value}")]
        result = subprocess.run([sys.executable, "-m", "stager", "stage", url, "--cache", str(self.cache),
                                 "--socket", str(self.socket), "--json", *flags], capture_output=True, text=True,
                                timeout=120, env=self.env, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def pid(self) -> int | None:
        try:
            return int((self.run_dir / "stager.pid").read_text())
        except (OSError, ValueError):
            return None

    def status(self) -> dict[str, Any]:
        result = subprocess.run([sys.executable, "-m", "stager", "status", "--json", "--cache", str(self.cache),
                                 "--socket", str(self.socket)], capture_output=True, text=True, timeout=60,
                                env=self.env, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


def _counted(value: Any, word: str) -> int:
    """The sum of the numbers under keys containing ``word`` (the status's bytes from peers)."""
    if isinstance(value, dict):
        return sum(item if word in str(key) and isinstance(item, int) and not isinstance(item, bool)
                   else _counted(item, word) for key, item in value.items())
    if isinstance(value, list):
        return sum(_counted(item, word) for item in value)
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def _mentions(value: Any, text: str) -> bool:
    if isinstance(value, dict):
        return any(_mentions(k, text) or _mentions(v, text) for k, v in value.items())
    if isinstance(value, list):
        return any(_mentions(v, text) for v in value)
    return isinstance(value, str) and text in value


_DOWN_WORDS = ("down", "dead", "unreachable", "failed")


def _says_down(entry: Any) -> bool:
    """A peer's entry that says it is down: a state word, or an alive/up/healthy flag that is false."""
    if isinstance(entry, str):
        return entry.lower() in _DOWN_WORDS
    if not isinstance(entry, dict):
        return False
    return any(isinstance(v, str) and v.lower() in _DOWN_WORDS for v in entry.values()) or any(
        v is False for k, v in entry.items() if str(k).lower() in ("alive", "live", "up", "healthy", "reachable"))


def _marked_down(value: Any, member: str) -> bool:
    """Whether a node's status says ``member`` is down: listed under a key saying so, or in an entry
    naming it (by key, or by a value such as its id) that says so."""
    if isinstance(value, list):
        return any(_marked_down(item, member) for item in value)
    if not isinstance(value, dict):
        return False
    if any(isinstance(v, str) and member in v for v in value.values()) and _says_down(value):
        return True
    for key, item in value.items():
        if any(word in str(key).lower() for word in _DOWN_WORDS) and _mentions(item, member):
            return True
        if member in str(key) and _says_down(item):
            return True
    return any(_marked_down(item, member) for item in value.values())


def _wait_for_peer(node: FakeNode, other: FakeNode, seconds: float = 60) -> None:
    """Until ``node``'s status lists ``other`` and does not say it is down (bounded)."""
    deadline = time.monotonic() + seconds
    while True:
        status = node.status()
        if _mentions(status, other.member) and not _marked_down(status, other.member):
            return
        assert time.monotonic() < deadline, f"{node.member} does not see {other.member} as a live peer: {status}"
        time.sleep(0.5)


@pytest.fixture
def job() -> Iterator[list[FakeNode]]:
    base = Path(tempfile.mkdtemp(prefix="stg-slurm-"))  # short: the daemons' sockets live under it
    nodes: list[FakeNode] = []
    try:
        site_secret = base / "peer-secret"
        site_secret.write_text(os.urandom(32).hex() + "\n")
        site_secret.chmod(0o600)
        stager = base / "stager"
        stager.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m stager "$@"\n')
        stager.chmod(0o755)
        port = _free_port(ADDRESSES)
        nodes = [FakeNode(base, f"node{i}", address, port, site_secret, stager) for i, address in enumerate(ADDRESSES)]
        yield nodes
    finally:
        for node in nodes:  # a daemon the epilog did not stop: stopped here, by its pid
            pid = node.pid()
            if pid and _alive(pid) and "stager" in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


def test_prolog_starts_daemons_that_find_each_other_and_epilog_stops_them(job, s3_server_factory):
    server = s3_server_factory()
    bucket = server.make_bucket("data")
    corpora = [make_corpus(bucket / f"corpus{i}", shards=3, tokens=100_000, block_size=64 * 1024, seed=i)
               for i in range(ATTEMPTS)]
    options = {"endpoint_url": server.endpoint_url, "key": server.access_key, "secret": server.secret_key}
    starts = [subprocess.Popen([str(SLURM / "prolog.sh")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=node.env, stdin=subprocess.DEVNULL) for node in job]
    for node, start in zip(job, starts):
        out, err = start.communicate(timeout=150)
        assert start.returncode == 0, f"prolog on {node.address} exited {start.returncode}:\n{err}"
        assert node.socket.is_socket() and node.pid() and _alive(node.pid())
        assert (node.run_dir / "peer-secret").stat().st_mode & 0o077 == 0
    # The same job secret on both nodes (derived from the site's and the job id), never the site's itself.
    secrets = {(node.run_dir / "peer-secret").read_text() for node in job}
    assert len(secrets) == 1 and (job[0].root.parent / "peer-secret").read_text() not in secrets

    # Each daemon lists the other as a live peer (bounded wait: health checks run in the background).
    _wait_for_peer(job[0], job[1])
    _wait_for_peer(job[1], job[0])

    # They talk, with the secret each derived on its own: what the first node staged, the second
    # gets from it rather than from the origin. A peer whose health check fails under load is
    # skipped for a while (the origin serves meanwhile, as it should), so each attempt is a
    # dataset of its own, staged once the second node sees the first as live.
    for attempt, corpus in enumerate(corpora):
        url = f"s3://data/corpus{attempt}"
        first = job[0].stage(url, options)
        assert first["failed"] == 0 and first["blobs"] == len(corpus.manifest)
        _wait_for_peer(job[1], job[0])
        before = _counted(job[1].status(), "bytes_from_peers")
        assert job[1].stage(url, options)["failed"] == 0
        if _counted(job[1].status(), "bytes_from_peers") > before:
            break
    else:
        raise AssertionError(f"the second node took nothing from its peer in {ATTEMPTS} datasets: {job[1].status()}")

    # A second prolog for the same job finds the daemon running and starts nothing.
    again = job[0].script("prolog.sh")
    assert again.returncode == 0 and "already runs" in again.stderr

    # The task prolog tells the job's tasks where their daemon is.
    exports = job[0].script("task-prolog.sh").stdout.splitlines()
    assert f"export STAGER_SOCKET={job[0].socket}" in exports and f"export STAGER_CACHE={job[0].cache}" in exports

    pids = [node.pid() for node in job]
    for node, pid in zip(job, pids):
        stop = node.script("epilog.sh")
        assert stop.returncode == 0, stop.stderr
        assert not _alive(pid), f"daemon {pid} still runs after the epilog"
        assert f"daemon pid {pid} stopped" in stop.stderr and "SIGKILL" not in stop.stderr  # SIGTERM was enough
        assert not node.run_dir.exists()       # socket, pid file, secret, log: gone
        assert node.cache.is_dir()             # the cache stays for the user's next job


def test_a_prolog_without_the_site_secret_fails_only_when_strict(job):
    node = job[0]
    missing = str(node.root / "no-such-secret")
    strict = node.script("prolog.sh", STAGER_SITE_SECRET_FILE=missing)
    assert strict.returncode == 1 and missing in strict.stderr
    lenient = node.script("prolog.sh", STAGER_SITE_SECRET_FILE=missing, STAGER_PROLOG_STRICT="0")
    assert lenient.returncode == 0 and "runs without a node daemon" in lenient.stderr
    assert node.pid() is None


def test_a_daemon_that_cannot_start_fails_the_strict_prolog_with_its_log_else_the_job_runs_without(job):
    node = job[0]
    result = node.script("prolog.sh", STAGER_PEER_LISTEN=f"{node.address}:notaport")
    assert result.returncode == 1
    assert "the daemon exited" in result.stderr and "stager: error:" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and node.pid() is None
    lenient = node.script("prolog.sh", STAGER_PEER_LISTEN=f"{node.address}:notaport", STAGER_PROLOG_STRICT="0")
    assert lenient.returncode == 0 and "runs without a node daemon" in lenient.stderr


def test_the_epilog_keeps_the_cache_unless_told_to_purge_it(job):
    node = job[0]
    for purge, kept in (("0", True), ("1", False)):
        node.run_dir.mkdir(parents=True)
        (node.cache / "blobs").mkdir(parents=True, exist_ok=True)
        (node.cache_root / "someone-else").mkdir(exist_ok=True)
        result = node.script("epilog.sh", STAGER_PURGE_CACHE=purge)
        assert result.returncode == 0, result.stderr
        assert node.cache.is_dir() is kept and not node.run_dir.exists()
        assert (node.cache_root / "someone-else").is_dir()  # other users' caches are never touched


def test_the_epilog_leaves_a_process_alone_that_is_not_the_jobs_daemon(job):
    node = job[0]
    node.run_dir.mkdir(parents=True)
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        (node.run_dir / "stager.pid").write_text(f"{bystander.pid}\n")
        result = node.script("epilog.sh")
        assert result.returncode == 0, result.stderr
        assert bystander.poll() is None and "not this job's daemon" in result.stderr
        assert not node.run_dir.exists()
    finally:
        bystander.kill()
        bystander.wait(timeout=10)
