"""Kills: the training process right after save returns (2 gloo ranks), the drainer mid-drain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from stager.checkpoint.drainer import spawn_drainer
from stager.checkpoint.journal import DrainJournal
from stager.checkpoint.staging import StagingDir
from stager.testing.s3server import free_port
from tests.checkpoint.conftest import wait_for
from tests.checkpoint.model import data_files

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _config(sides, tmp_path, name: str, world: int, **extra) -> dict:
    dest, replica = sides
    return {"world": world, "port": free_port(), "url": dest.url(f"run/{name}"), "options": dest.options,
            "replica": replica.url(f"run/{name}"), "replica_options": replica.options,
            "staging": str(tmp_path / "staging"), **extra}


def _train(config: dict, tmp_path) -> subprocess.Popen:
    path = tmp_path / "train.json"
    path.write_text(json.dumps(config))
    return subprocess.Popen([sys.executable, "-m", "tests.checkpoint.train", str(path)], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


@pytest.mark.parametrize("world", [2])  # one rank in-process: test_save.py
def test_sigkill_of_training_right_after_save_still_ends_complete(sides, tmp_path, world):
    for side in sides:
        side.proxy.update(latency_s=0.2, methods=("PUT",), path_contains="/run/")
    config = _config(sides, tmp_path, f"w{world}", world)
    proc = _train(config, tmp_path)
    try:
        line = proc.stdout.readline()  # bounded: the process lingers at most 60 s after saving
        assert line.startswith("SAVED"), line
    finally:
        _kill_group(proc)  # every rank and the spawner: SIGKILL, the moment save returned
    entry = StagingDir(tmp_path / "staging").entry(config["url"])
    assert not entry.drained
    wait_for(lambda: entry.drained, 60, "the drainer, which outlives the training process")
    local = data_files(entry.path)
    assert len(local) == 2 * world + 1  # each rank's two files and .metadata
    for side in sides:
        assert data_files(side.path(f"run/w{world}")) == local


def test_sigkill_of_the_drainer_mid_drain_resumes_without_resending(sides, tmp_path):
    dest, replica = sides
    for side in sides:
        side.proxy.update(latency_s=0.3, methods=("PUT",), path_contains="/run/")
    config = _config(sides, tmp_path, "killed", 1, drain="none", linger=0)
    proc = _train(config, tmp_path)
    assert proc.stdout.readline().startswith("SAVED")
    proc.wait(timeout=60)
    staging = StagingDir(tmp_path / "staging")
    entry = staging.entry(config["url"])
    drainer = spawn_drainer(staging.root)
    try:
        wait_for(lambda: len(DrainJournal(entry.path).verified) >= 1, 60, "a first file verified")
    finally:
        drainer.send_signal(signal.SIGKILL)
        drainer.wait(timeout=30)
    assert not entry.drained
    before = DrainJournal(entry.path).verified
    puts_before = {(i, p): side.puts(f"/run/killed/{p}") for i, side in enumerate(sides) for _, p, _ in before}
    again = spawn_drainer(staging.root)
    try:
        wait_for(lambda: entry.drained, 60, "the resumed drain")
    finally:
        again.wait(timeout=30)
    for store, path, _ in before:  # what was verified before the kill was not sent again
        assert sides[store].puts(f"/run/killed/{path}") == 1
        assert puts_before[(store, path)] == 1
    local = data_files(entry.path)
    for side in sides:
        assert data_files(side.path("run/killed")) == local
        assert side.puts("/run/killed/__") <= 2 + 2  # each data file once, at most the ones in flight twice


def test_sigkill_mid_multipart_upload_resumes_without_resending_written_parts(sides, tmp_path):
    from stager.checkpoint.drain import queue_folder
    from stager.config import SourceConfig

    dest, replica = sides
    for side in sides:
        side.proxy.update(latency_s=0.4, methods=("PUT",), path_contains="/run/big")
    folder = tmp_path / "big"
    folder.mkdir()
    data = os.urandom(12 << 20)  # three parts of 5 MiB
    (folder / "weights.bin").write_bytes(data)
    staging = StagingDir(tmp_path / "staging")
    entry = queue_folder(staging, folder, dest.url("run/big"),
                         [SourceConfig(dest.url("run/big"), dest.options),
                          SourceConfig(replica.url("run/big"), replica.options)])
    command = [sys.executable, "-m", "stager.checkpoint.drainer", str(staging.root), "--part-size", str(5 << 20),
               "--concurrency", "1"]
    first = subprocess.Popen(command, start_new_session=True)
    try:
        wait_for(lambda: sum(len(p) for p in DrainJournal(entry.path).parts.values()) >= 2, 60, "two parts written")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    journal = DrainJournal(entry.path)
    written = {key: dict(parts) for key, parts in journal.parts.items()}
    assert not entry.drained and written
    puts_before = [side.puts("/run/big/weights.bin") for side in sides]
    subprocess.run(command, timeout=120, check=True)
    assert entry.drained
    for index, side in enumerate(sides):
        assert (side.path("run/big") / "weights.bin").read_bytes() == data
        done = sum(len(parts) for (store, _, _), parts in written.items() if store == index)
        # the second drain sends exactly the parts the first had not recorded
        assert side.puts("/run/big/weights.bin") - puts_before[index] == 3 - done
