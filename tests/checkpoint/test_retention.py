"""Retention keeps what it promises: only checkpoints complete at every store go, never the newest complete."""

from __future__ import annotations

import json

import pytest
import torch.distributed.checkpoint as dcp

from stager.checkpoint import CheckpointWriter
from stager.checkpoint.drainer import drain_until_empty
from stager.checkpoint.inventory import CheckpointState
from stager.checkpoint.manifest import MANIFEST_PATH, CheckpointManifest
from stager.checkpoint.retention import to_delete
from stager.checkpoint.staging import StagingDir
from stager.cli import main
from stager.errors import ConfigError
from tests.checkpoint.model import state_dict

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _state(step: int, complete: bool) -> CheckpointState:
    manifest = CheckpointManifest((), ("a", "b"), created=float(step))
    return CheckpointState(f"step-{step}", f"a/step-{step}", manifest,
                           {"a": "complete", "b": "complete" if complete else "draining"})


def test_to_delete_keeps_the_last_k_every_m_and_everything_incomplete():
    states = [_state(s, complete=s != 9) for s in range(1, 10)]  # 9: newest, still draining at b
    doomed = [c.step for c in to_delete(states, keep_last=2, keep_every=4)]
    assert doomed == [1, 2, 3, 5, 6]  # kept: 4, 8 (every 4), 7, 8 (last 2 complete), 9 (not complete)
    assert [c.step for c in to_delete(states, keep_last=1)] == [1, 2, 3, 4, 5, 6, 7]
    with pytest.raises(ConfigError, match="newest complete checkpoint is always kept"):
        to_delete(states, keep_last=0)


def test_prune_deletes_only_complete_checkpoints_at_every_store(tmp_path, capsys):
    dest, replica = tmp_path / "dest", tmp_path / "replica"
    for step in range(1, 7):
        writer = CheckpointWriter(f"{dest.as_uri()}/step-{step}", staging_dir=tmp_path / "staging",
                                  replicas=[f"{replica.as_uri()}/step-{step}"], drain="none")
        dcp.save(state_dict(), storage_writer=writer)
    assert drain_until_empty(StagingDir(tmp_path / "staging")) == 6
    (replica / "step-5" / MANIFEST_PATH).unlink()  # step 5 is not complete at the replica
    main(["checkpoints", "prune", dest.as_uri(), "--keep-last", "2", "--keep-every", "3"])
    out = capsys.readouterr().out
    assert "deleting step-1" in out and "deleting step-2" in out and "kept 4 of 6" in out
    for root in (dest, replica):
        left = sorted(p.name for p in root.iterdir() if any(f.is_file() for f in p.rglob("*")))
        assert left == ["step-3", "step-4", "step-5", "step-6"]
    main(["checkpoints", "list", dest.as_uri(), "--json"])
    states = {c["name"]: c["complete"] for c in json.loads(capsys.readouterr().out)}
    assert states == {"step-3": True, "step-4": True, "step-5": False, "step-6": True}
