"""Objects deleted and corrupted at the destination: CheckpointReader loads anyway, verify repairs them."""

from __future__ import annotations

import json

import pytest
import torch.distributed.checkpoint as dcp

from stager.checkpoint import CheckpointReader, CheckpointWriter
from stager.checkpoint.drainer import drain_until_empty
from stager.checkpoint.staging import StagingDir
from stager.cli import main
from tests.checkpoint.model import data_files, empty_like, same_tensors, state_dict

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _saved(sides, tmp_path, name: str) -> dict[str, bytes]:
    dest, replica = sides
    writer = CheckpointWriter(dest.url(f"run/{name}"), staging_dir=tmp_path / "staging",
                              replicas=[replica.url(f"run/{name}")], storage_options=dest.options,
                              replica_options={replica.url(f"run/{name}"): replica.options}, thread_count=2,
                              drain="none")
    dcp.save(state_dict(), storage_writer=writer)
    staging = StagingDir(tmp_path / "staging")
    assert drain_until_empty(staging) == 1
    return data_files(staging.entry(writer.url).path)


def _damage(folder) -> tuple[str, str]:
    """Delete one data file and flip a byte of the other; return their names."""
    first, second = sorted(p.name for p in folder.glob("*.distcp"))
    (folder / first).unlink()
    data = bytearray((folder / second).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / second).write_bytes(bytes(data))
    return first, second


def test_reader_loads_from_the_replica_and_verify_repairs_the_destination(sides, tmp_path, capsys):
    dest, replica = sides
    local = _saved(sides, tmp_path, "s1")
    deleted, corrupted = _damage(dest.path("run/s1"))

    reader = CheckpointReader(dest.url("run/s1"), cache_dir=tmp_path / "cache", storage_options=dest.options,
                              replica_options={replica.url("run/s1"): replica.options}, session_mode="embedded")
    state = empty_like(state_dict())
    dcp.load(state, storage_reader=reader)
    assert same_tensors(state, state_dict())
    assert reader.sources[deleted] == reader.sources[corrupted] == replica.url("run/s1")
    assert {name for name, _, _ in reader.fallbacks} == {deleted, corrupted}  # reported

    args = ["checkpoints", "verify", dest.url("run/s1"), *dest.flags("-o"), *replica.flags("-r")]
    with pytest.raises(SystemExit) as exit_info:
        main(["checkpoints", "verify", "--no-repair", *args[2:]])
    assert exit_info.value.code == 1
    capsys.readouterr()
    main(args)
    out = capsys.readouterr().out
    assert f"{dest.url('run/s1')}: 2 bad" in out and "repaired 2" in out
    assert f"{replica.url('run/s1')}: ok" in out
    assert data_files(dest.path("run/s1")) == local
    main(["checkpoints", "verify", "--no-repair", *args[2:]])
    assert "2 bad" not in capsys.readouterr().out


def test_list_shows_each_store_state(sides, tmp_path, capsys):
    dest, replica = sides
    _saved(sides, tmp_path, "step-1")
    _saved(sides, tmp_path, "step-2")
    (dest.path("run/step-2") / ".metadata").unlink()
    main(["checkpoints", "list", dest.url("run"), "--json", *dest.flags("-o"),
          *replica.flags("-r")])
    found = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert found["step-1"]["complete"] and set(found["step-1"]["stores"].values()) == {"complete"}
    assert found["step-2"]["stores"] == {dest.url("run/step-2"): "damaged", replica.url("run/step-2"): "complete"}
    assert not found["step-2"]["complete"]
