"""A staging directory too small for the next save: it waits for the drain, or fails loudly, never drops one."""

from __future__ import annotations

import threading

import pytest
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from stager.checkpoint import CheckpointWriter
from stager.checkpoint.drainer import drain_until_empty
from stager.checkpoint.staging import StagingDir
from tests.checkpoint.model import state_dict

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
ONE_SAVE = 4 * 64 * 128 * 4  # the model's tensor bytes
FITS_ONE = ONE_SAVE + (1 << 20) + (64 << 10)  # one save and the writer's slack, not two


def _refused(info: pytest.ExceptionInfo, text: str) -> None:
    """DCP wraps what a rank raised in its own CheckpointException: the line must be in it."""
    assert "StagingFull" in str(info.value) and text in str(info.value), str(info.value)


def _save(tmp_path, name: str, capacity: int, wait: float) -> CheckpointWriter:
    writer = CheckpointWriter((tmp_path / "dest" / name).as_uri(), staging_dir=tmp_path / "staging",
                              staging_capacity=capacity, wait_for_room=wait, drain="none")
    dcp.save(state_dict(), storage_writer=writer)
    return writer


def test_a_save_larger_than_the_staging_capacity_fails_at_once(tmp_path):
    with pytest.raises(CheckpointException) as info:
        _save(tmp_path, "big", capacity=ONE_SAVE // 2, wait=60)
    _refused(info, "is larger than the staging capacity")


def test_a_save_that_does_not_fit_fails_after_waiting_and_keeps_the_older_checkpoint(tmp_path):
    capacity = FITS_ONE  # one save and its slack, not two
    first = _save(tmp_path, "a", capacity, wait=0)
    with pytest.raises(CheckpointException) as info:
        _save(tmp_path, "b", capacity, wait=0.3)
    _refused(info, "after waiting 0.3s for the drain (1 checkpoint(s) still draining)")
    staging = StagingDir(tmp_path / "staging")
    assert [e.path for e in staging.pending()] == [first.path]  # the undrained one is still there, whole


def test_a_save_that_does_not_fit_waits_for_the_drain_then_goes_on(tmp_path):
    capacity = FITS_ONE
    first = _save(tmp_path, "a", capacity, wait=0)
    staging = StagingDir(tmp_path / "staging")
    drainer = threading.Timer(0.3, drain_until_empty, args=(staging,))
    drainer.start()
    try:
        second = _save(tmp_path, "b", capacity, wait=30)  # waits for the drain, then the drained one makes room
    finally:
        drainer.join(timeout=30)
    assert (tmp_path / "dest" / "a" / ".stager" / "checkpoint.json").exists()
    assert not first.path.exists() and second.path.exists()
