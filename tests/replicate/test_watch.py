"""``--watch``: files are replicated only once complete (stable, and a marker or a quiet period)."""

from __future__ import annotations

import asyncio
import json
import os
import time

from stager.config import SourceConfig
from stager.manifest import MANIFEST_PATH, read_manifest_file
from stager.replicate import ReplicateConfig
from stager.replicate.watch import WatchConfig, watch_replicate
from tests.cli.runner import run

from .dataset import FAST_RETRY


async def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def listed(dst) -> dict[str, int]:
    path = dst / MANIFEST_PATH
    if not path.exists():
        return {}
    return {e.path: e.size for e in read_manifest_file(str(path))}


async def test_checkpoint_is_copied_only_once_complete(tmp_path):
    src, dst = tmp_path / "ckpt", tmp_path / "replica"
    (src / "step-1").mkdir(parents=True)
    config = ReplicateConfig(src=SourceConfig(str(src)), dst=SourceConfig(str(dst)), state_dir=str(tmp_path / "st"),
                             retry=FAST_RETRY)
    watch = WatchConfig(interval=0.1, quiet_period=1.5, block_size=64 * 1024)
    task = asyncio.create_task(watch_replicate(config, watch))
    try:
        model = src / "step-1" / "model.bin"
        chunks = [os.urandom(300_000) for _ in range(4)]
        with open(model, "wb") as fh:  # a checkpoint being written, slowly
            for chunk in chunks[:3]:
                fh.write(chunk)
                fh.flush()
                await asyncio.sleep(0.3)
            assert not (dst / "step-1" / "model.bin").exists()  # growing: never taken
            fh.write(chunks[3])
        await asyncio.sleep(0.3)
        assert not (dst / "step-1" / "model.bin").exists()  # stable, but no marker and not quiet long enough
        (src / "step-1" / "COMPLETE").write_bytes(b"")
        await wait_for(lambda: "step-1/COMPLETE" in listed(dst))
        assert (dst / "step-1" / "model.bin").read_bytes() == b"".join(chunks)
        assert listed(dst) == {"step-1/model.bin": 1_200_000, "step-1/COMPLETE": 0}
        # The marker went last: whoever waits for it at the destination sees the whole folder.
        assert (dst / "step-1" / "COMPLETE").stat().st_mtime >= (dst / "step-1" / "model.bin").stat().st_mtime

        (src / "notes.txt").write_bytes(b"no marker here")
        await asyncio.sleep(0.5)
        assert "notes.txt" not in listed(dst)  # waits for the quiet period
        await wait_for(lambda: "notes.txt" in listed(dst))
        assert (dst / "notes.txt").read_bytes() == b"no marker here"
    finally:
        task.cancel()
        summary = await task  # cancelling is how it is stopped (SIGTERM does the same)
    assert summary["stopped_by_signal"] and summary["copied_objects"] == 3 and summary["failed"] == 0


def test_watch_command_exits_when_idle_and_resumes_from_its_state(tmp_path):
    src, dst = tmp_path / "ckpt", tmp_path / "replica"
    (src / "a").mkdir(parents=True)
    (src / "a" / "shard.bin").write_bytes(os.urandom(100_000))
    (src / "a" / "_SUCCESS").write_bytes(b"")
    command = ["replicate", str(src), str(dst), "--watch", "--interval", "0.1", "--quiet-period", "30",
               "--idle-exit", "1.5", "--state-dir", str(tmp_path / "st"), "--block-size", "64KiB", "--json"]
    first = json.loads(run(command, check=True, timeout=60).stdout)
    assert first["copied_objects"] == 2 and first["pending"] == 0
    assert set(listed(dst)) == {"a/shard.bin", "a/_SUCCESS"}
    (src / "b.bin").write_bytes(b"written without a marker")  # not quiet for 30 s: stays pending
    second = json.loads(run(command, check=True, timeout=60).stdout)
    assert second["copied_objects"] == 0 and second["pending"] == 1
    assert set(listed(dst)) == {"a/shard.bin", "a/_SUCCESS"}
