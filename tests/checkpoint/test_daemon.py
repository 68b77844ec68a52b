"""With a node daemon up, it drains (and exports the drain's metrics); killed mid-drain, a drainer finishes."""

from __future__ import annotations

import signal
import socket

import pytest
import torch.distributed.checkpoint as dcp

from stager.checkpoint import CheckpointWriter
from stager.checkpoint.drainer import spawn_drainer
from stager.checkpoint.journal import DrainJournal
from stager.checkpoint.staging import StagingDir
from tests.checkpoint.conftest import wait_for
from tests.checkpoint.model import data_files, state_dict
from tests.daemon.support import DaemonProcess, remove_dir, short_dir

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    where = short_dir()
    proc = DaemonProcess(where / "d.sock", tmp_path / "cache").start()
    monkeypatch.setenv("STAGER_SOCKET", str(proc.socket))
    try:
        yield proc
    finally:
        proc.kill()
        remove_dir(where)


def _metrics(sock_path) -> str:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(sock_path))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: stager\r\nConnection: close\r\n\r\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def _save(sides, tmp_path, name: str) -> CheckpointWriter:
    dest, replica = sides
    writer = CheckpointWriter(dest.url(f"run/{name}"), staging_dir=tmp_path / "staging",
                              replicas=[replica.url(f"run/{name}")], storage_options=dest.options,
                              replica_options={replica.url(f"run/{name}"): replica.options}, thread_count=2)
    dcp.save(state_dict(), storage_writer=writer)
    return writer


def test_the_daemon_drains_and_reports_it(sides, tmp_path, daemon):
    writer = _save(sides, tmp_path, "by-daemon")
    entry = StagingDir(tmp_path / "staging").entry(writer.url)
    wait_for(lambda: entry.drained, 60, "the daemon's drain")
    for side in sides:
        assert data_files(side.path("run/by-daemon")) == data_files(entry.path)
    assert not (tmp_path / "staging" / ".drain.log").exists()  # no drainer process was needed
    text = _metrics(daemon.socket)
    staging = str((tmp_path / "staging").absolute())
    assert f'stager_checkpoints{{staging="{staging}",state="drained"}} 1.0' in text
    assert f'stager_checkpoint_drain_lag_seconds{{staging="{staging}"}} 0.0' in text
    assert f'stager_checkpoint_drained_bytes_total{{staging="{staging}"}}' in text


def test_sigkill_of_the_daemon_mid_drain_then_a_drainer_completes(sides, tmp_path, daemon):
    for side in sides:
        side.proxy.update(latency_s=0.3, methods=("PUT",), path_contains="/run/")
    writer = _save(sides, tmp_path, "daemon-killed")
    entry = StagingDir(tmp_path / "staging").entry(writer.url)
    wait_for(lambda: len(DrainJournal(entry.path).verified) >= 1, 60, "the daemon's first verified file")
    daemon.signal(signal.SIGKILL)
    daemon.wait(30)
    assert not entry.drained
    before = DrainJournal(entry.path).verified
    drainer = spawn_drainer(tmp_path / "staging")
    try:
        wait_for(lambda: entry.drained, 60, "the drainer after the daemon's death")
    finally:
        drainer.wait(timeout=30)
    for store, path, _ in before:
        assert sides[store].puts(f"/run/daemon-killed/{path}") == 1
    for side in sides:
        assert data_files(side.path("run/daemon-killed")) == data_files(entry.path)
