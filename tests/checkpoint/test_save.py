"""dcp.save / async_save through CheckpointWriter: returns on local disk, drains verified to both stores."""

from __future__ import annotations

import warnings

import pytest
import torch.distributed.checkpoint as dcp

from stager.checkpoint import CheckpointWriter
from stager.checkpoint.manifest import MANIFEST_PATH, CheckpointManifest
from stager.checkpoint.staging import StagingDir
from tests.checkpoint.conftest import wait_for
from tests.checkpoint.model import data_files, empty_like, same_tensors, state_dict

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _writer(dest, replica, tmp_path, name: str, **kwargs) -> CheckpointWriter:
    return CheckpointWriter(dest.url(f"run/{name}"), staging_dir=tmp_path / "staging",
                            replicas=[replica.url(f"run/{name}")], storage_options=dest.options,
                            replica_options={replica.url(f"run/{name}"): replica.options}, thread_count=2, **kwargs)


def _assert_complete(side, name: str, local: dict[str, bytes]) -> None:
    folder = side.path(f"run/{name}")
    assert data_files(folder) == local
    manifest = CheckpointManifest.decode((folder / MANIFEST_PATH).read_bytes(), "manifest")
    assert {f.path for f in manifest.files} == set(local)
    state = empty_like(state_dict())
    dcp.load(state, storage_reader=dcp.FileSystemReader(folder))  # DCP's own reader, no stager
    assert same_tensors(state, state_dict())


@pytest.mark.parametrize("mode", ["save", "async_save"])
def test_save_returns_before_the_drain_and_both_stores_end_complete(sides, tmp_path, mode):
    dest, replica = sides
    for side in sides:  # every write to the stores is slow: the drain cannot end before save returns
        side.proxy.update(latency_s=0.3, methods=("PUT",), path_contains="/run/")
    writer = _writer(dest, replica, tmp_path, mode, drain="process")
    if mode == "save":
        dcp.save(state_dict(), storage_writer=writer)
    else:
        dcp.async_save(state_dict(), storage_writer=writer).result(timeout=60)
    assert not (dest.path(f"run/{mode}") / MANIFEST_PATH).exists()
    assert not (dest.path(f"run/{mode}") / ".metadata").exists()
    entry = StagingDir(tmp_path / "staging").entry(writer.url)
    local = data_files(entry.path)
    assert len(local) == 3  # two data files and .metadata
    wait_for(lambda: entry.drained, 60, "the drain")
    for side in sides:
        _assert_complete(side, mode, local)


def test_faults_at_both_stores_are_retried(sides, tmp_path):
    dest, replica = sides
    for side in sides:
        side.proxy.update(error500_p=0.4, reset_p=0.2, flip_p=0.2, methods=("GET", "PUT", "HEAD"), max_faults=4)
    writer = _writer(dest, replica, tmp_path, "faulty", drain="none")
    dcp.save(state_dict(), storage_writer=writer)
    from stager.checkpoint.drainer import drain_until_empty

    assert drain_until_empty(StagingDir(tmp_path / "staging")) == 1
    local = data_files(StagingDir(tmp_path / "staging").entry(writer.url).path)
    for side in sides:
        _assert_complete(side, "faulty", local)
    assert sum(s.proxy.stats().total_faults for s in sides) > 0
