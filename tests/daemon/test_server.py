"""The daemon's life cycle as a real process: one per socket, private socket, drain on SIGTERM, resume.

``python -m stager serve`` runs in a child process; what is checked is what
an operator sees: exit statuses, one-line errors, the socket file and its
mode, how long a stop takes, and, through the fault proxy's counters, that a
stop and restart fetch no verified block twice.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from stager.cache import CacheTier
from stager.config import CacheConfig
from stager.daemon_client import probe
from stager.testing import FaultPlan
from tests.daemon.support import (REPO, ConsumerProcess, DaemonProcess, assert_stream, make_corpus, remove_dir,
                                  short_dir, wait_until)


@pytest.fixture
def work():
    path = short_dir()
    (path / "cache").mkdir()
    try:
        yield path
    finally:
        remove_dir(path)


@pytest.fixture
def daemons(work):
    started: list[DaemonProcess] = []

    def start(*args: str, wait: bool = True, socket_name: str = "d.sock") -> DaemonProcess:
        d = DaemonProcess(work / socket_name, work / "cache", args=args)
        started.append(d)
        return d.start(wait=wait)

    try:
        yield start
    finally:
        for d in started:
            d.kill()


def _serve(work, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "stager", "serve", "--cache", str(work / "cache"), "--capacity", "1GB", *args]
    env = {k: v for k, v in os.environ.items() if k not in ("STAGER_SOCKET", "STAGER_CONFIG")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def test_a_second_daemon_on_the_same_socket_refuses_to_start(work, daemons):
    first = daemons()
    result = _serve(work, "--socket", str(work / "d.sock"))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"stager: error: another stager daemon (pid {first.pid}) is already serving {work / 'd.sock'}; "
        "stop it first, or give this one another --socket")
    health = probe(work / "d.sock")
    assert health is not None and health["pid"] == first.pid, "the first daemon is untouched"


def _connect_as(uid: int, path) -> str:
    """Try to connect to ``path`` as user and group ``uid`` (in a forked child); its errno name or "ok"."""
    import errno

    pid = os.fork()
    if pid == 0:  # the child only makes system calls, then leaves without running any Python cleanup
        code = 0
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(path))
        except OSError as exc:
            code = exc.errno or 255
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return "ok" if code == 0 else errno.errorcode.get(code, str(code))


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_the_socket_keeps_other_users_out(work, daemons):
    os.chmod(work, 0o755)  # the directory lets anyone through: the socket's own mode must keep them out
    daemons()
    mode = stat.S_IMODE(os.stat(work / "d.sock").st_mode)
    assert mode == 0o600
    assert _connect_as(65534, work / "d.sock") == "EACCES"
    assert _connect_as(0, work / "d.sock") == "ok"


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_a_socket_group_lets_its_members_in(work, daemons):
    os.chmod(work, 0o755)
    gid = 65534  # nogroup: "nobody" is in it, so it can connect; anyone else cannot
    import grp

    daemons("--socket-group", grp.getgrgid(gid).gr_name)
    st = os.stat(work / "d.sock")
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == gid
    assert _connect_as(65534, work / "d.sock") == "ok"


def test_sigint_stops_an_idle_daemon_cleanly(work, daemons):
    d = daemons()
    began = time.monotonic()
    d.signal(signal.SIGINT)
    assert d.wait(30) == 0
    assert time.monotonic() - began < 10
    assert not (work / "d.sock").exists(), "the socket is removed"
    assert "stager daemon stopped" in d.output()


def test_sigterm_drains_blocks_in_flight_and_a_restart_fetches_no_verified_block_twice(
        work, daemons, tmp_path, http_origin_factory, fault_proxy):
    # More shards than requests in flight: one request may span a whole shard, and the drain lets
    # the ones in flight finish, so only shards beyond them are certain to be left unfetched.
    corpus = make_corpus(tmp_path / "corpus", shards=8, tokens=512 * 1024, block_size=64 * 1024)  # 8 x 1 MiB
    m = corpus.manifest
    proxy = fault_proxy(http_origin_factory(corpus.root), FaultPlan(bandwidth_bps=1.5e6))
    d = daemons("--no-hedge", "--concurrency", "2", "--drain-timeout", "10")
    order = list(range(len(m)))
    consumer = ConsumerProcess(tmp_path / "c.jsonl", socket=work / "d.sock", cache=work / "cache",
                               source=proxy.url, order=order, reconnect_timeout=60).start()
    try:
        wait_until(lambda: proxy.stats().bytes_down > m.total_bytes // 4, 60, "a quarter of the data to arrive")
        began = time.monotonic()
        d.signal(signal.SIGTERM)
        assert d.wait(30) == 0, d.output()
        assert time.monotonic() - began < 10 + 5, "the stop is bounded by the drain timeout"
        assert "drained the block requests in flight" in d.output()
        assert not (work / "d.sock").exists()
        with CacheTier(CacheConfig(directory=work / "cache", capacity=1 << 30)) as cache:
            usage, report = cache.usage(), cache.verify()
        assert report.ok, "what the stopped daemon left is consistent and verified"
        assert usage.complete + usage.partial >= 1 and usage.complete < len(m), "the stop came mid-fetch"

        daemons("--no-hedge", "--concurrency", "2")
        assert consumer.wait(120) == 0, consumer.errors()
    finally:
        consumer.kill()
    assert_stream(consumer, corpus, order)
    assert consumer.summary()["stats"]["daemon_reconnects"] >= 1
    # Every shard byte crossed once, although the stop came in the middle of fetching blocks; the
    # manifest was read by each daemon and by the consumer.
    assert proxy.stats().bytes_down == m.total_bytes + 3 * corpus.manifest_size
