"""A save whose two gloo ranks each stage on their own node: each node drains its part, rank 0's publishes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

from stager.checkpoint import CheckpointReader
from stager.checkpoint.drainer import spawn_drainer
from stager.checkpoint.journal import DrainJournal
from stager.checkpoint.manifest import MANIFEST_PATH, CheckpointManifest
from stager.checkpoint.parts import part_path
from stager.checkpoint.staging import StagingDir
from stager.cli import main
from tests.checkpoint.conftest import wait_for
from tests.checkpoint.model import data_files, empty_like, same_tensors, state_dict
from tests.checkpoint.test_kill import _config, _kill_group, _train

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
WORLD = 2


def _save(sides, tmp_path, name: str, **extra) -> tuple[dict, list[StagingDir]]:
    """Two ranks save through their own staging directories; return the config and those directories."""
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    config = _config(sides, tmp_path, name, WORLD, staging=[str(n) for n in nodes], **extra)
    proc = _train(config, tmp_path)
    try:
        line = proc.stdout.readline()  # bounded: the ranks linger at most 60 s after saving
        assert line.startswith("SAVED"), line
    finally:
        _kill_group(proc)
    return config, [StagingDir(n) for n in nodes]


def _loads(folder) -> None:
    state = empty_like(state_dict(ranks=(0, 1), world=WORLD))
    dcp.load(state, storage_reader=dcp.FileSystemReader(folder))
    assert same_tensors(state, state_dict(ranks=(0, 1), world=WORLD))


def _puts(side, prefix: str) -> list[str]:
    """The names PUT under ``prefix`` at ``side``, in the order the proxy saw them."""
    return [e.path.split(prefix, 1)[1].split("?")[0] for e in side.proxy.events if e.method == "PUT" and prefix in e.path]


def test_each_node_drains_its_part_and_rank_0_publishes_once_all_are_verified(sides, tmp_path):
    dest, replica = sides
    for side in sides:
        side.proxy.update(latency_s=0.2, methods=("PUT",), path_contains="/run/mn/")
    config, nodes = _save(sides, tmp_path, "mn")
    assert not (dest.path("run/mn") / ".metadata").exists()  # save returned before the drain
    entries = [n.entry(config["url"]) for n in nodes]
    assert ".metadata" not in data_files(entries[1].path)  # rank 1's node never had it
    for entry in entries:
        wait_for(lambda: entry.drained, 60, f"the drain of {entry.path.parent.name}")
    local = {**data_files(entries[0].path), **data_files(entries[1].path)}
    assert len(local) == 2 * WORLD + 1
    for side in sides:
        folder = side.path("run/mn")
        assert data_files(folder) == local  # every node's files, byte-exact, at both stores
        manifest = CheckpointManifest.decode((folder / MANIFEST_PATH).read_bytes(), "manifest")
        assert {f.path for f in manifest.files} == set(local)
        assert manifest.stores == (config["url"], config["replica"])
        order = _puts(side, "/run/mn/")
        assert order[-2:] == [".metadata", MANIFEST_PATH]  # after every data file and both part records
        assert {part_path(0), part_path(1)} <= set(order[:-2])
        _loads(folder)  # DCP's own reader, no stager
    state = empty_like(state_dict(ranks=(0, 1), world=WORLD))
    fsspec_reader = FsspecReader(replica.url("run/mn"), **replica.options)  # DCP's fsspec reader, over S3
    dcp.load(state, storage_reader=fsspec_reader)
    assert same_tensors(state, state_dict(ranks=(0, 1), world=WORLD))
    reader = CheckpointReader(config["url"], cache_dir=tmp_path / "cache", storage_options=dest.options,
                              staging_dir=nodes[1].root, session_mode="embedded")
    state = empty_like(state_dict(ranks=(0, 1), world=WORLD))
    dcp.load(state, storage_reader=reader)
    assert same_tensors(state, state_dict(ranks=(0, 1), world=WORLD))
    assert reader.sources["__1_0.distcp"] == "staging" and reader.sources[".metadata"] == config["url"]


def test_a_node_killed_before_its_part_lands_leaves_the_checkpoint_unpublished_until_it_drains_again(
        sides, tmp_path, capsys):
    dest, replica = sides
    for side in sides:  # rank 1's part record cannot land: its node's drain keeps retrying it
        side.proxy.update(slowdown_p=1.0, methods=("PUT",), path_contains=part_path(1))
    config, nodes = _save(sides, tmp_path, "mk", drain="none", linger=0)
    entries = [n.entry(config["url"]) for n in nodes]
    publisher = spawn_drainer(nodes[0].root)
    node1 = spawn_drainer(nodes[1].root)
    try:
        own = list(data_files(entries[1].path))
        wait_for(lambda: len(DrainJournal(entries[1].path).verified) == 2 * len(own), 60,
                 "node 1's data files verified at both stores")
        wait_for(lambda: DrainJournal(entries[0].path).awaiting, 30, "rank 0's node waiting for part 1")
    finally:
        node1.send_signal(signal.SIGKILL)
        node1.wait(timeout=30)
    try:
        waits = DrainJournal(entries[0].path).awaiting
        assert all(parts == [1] and set(files) == set(own) for parts, files in waits.values())
        for side in sides:
            folder = side.path("run/mk")
            assert not (folder / ".metadata").exists() and not (folder / MANIFEST_PATH).exists()
            assert (folder / part_path(0)).exists() and not (folder / part_path(1)).exists()
        main(["checkpoints", "list", dest.url("run"), *dest.flags("-o"), "--replica", replica.url("run"),
                  *replica.flags("-r"), "--json"])
        listed = json.loads(capsys.readouterr().out)
        assert [c["name"] for c in listed] == ["mk"]
        assert set(listed[0]["stores"].values()) == {"incomplete"}
        missing = listed[0]["missing"]
        assert set(missing) == {config["url"], config["replica"]}
        assert all(len(m) == 1 and m[0].startswith("part 1 (host ") and m[0].endswith(", rank 1)")
                   for m in missing.values())
        for side in sides:
            side.proxy.update(slowdown_p=0.0)
        subprocess.run([sys.executable, "-m", "stager.checkpoint.drainer", str(nodes[1].root)], timeout=60,
                       check=True)  # that node's drain, run again, sends only its part record
        assert entries[1].drained
        lines = [json.loads(line) for line in (entries[1].path / ".stager/journal").read_text().splitlines()]
        assert sum(1 for line in lines if line["kind"] == "verified") == 2 * len(own)  # none sent again
        wait_for(lambda: entries[0].drained, 30, "rank 0's node publishing the checkpoint")
    finally:
        publisher.send_signal(signal.SIGKILL)
        publisher.wait(timeout=30)
    local = {**data_files(entries[0].path), **data_files(entries[1].path)}
    for side in sides:
        assert data_files(side.path("run/mk")) == local
        _loads(side.path("run/mk"))
    capsys.readouterr()
    main(["checkpoints", "verify", "--no-repair", dest.url("run/mk"), *dest.flags("-o"), *replica.flags("-r")])
    out = capsys.readouterr().out  # every node's files read back at both stores against the one manifest
    assert f"{config['url']}: ok" in out and f"{config['replica']}: ok" in out


def test_waiting_for_a_dead_node_is_bounded_and_younger_checkpoints_drain_meanwhile(sides, tmp_path):
    import dataclasses

    from stager.checkpoint.drain import Drain, queue_folder
    from stager.checkpoint.drainer import drain_until_empty
    from stager.config import SourceConfig

    dest, _ = sides
    config, nodes = _save(sides, tmp_path, "mw", drain="none", linger=0)
    waiting = nodes[0].entry(config["url"])
    waiting.write_spec(dataclasses.replace(waiting.spec(), part_wait=1.0))  # rank 1's node never drains
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"w" * 1000)
    younger = queue_folder(nodes[0], folder, dest.url("run/hf"), [SourceConfig(dest.url("run/hf"), dest.options)])
    drain = Drain(nodes[0])
    assert drain_until_empty(nodes[0], drain) == 1  # the younger one, while the older waited
    assert younger.drained and not waiting.drained
    assert waiting.name in drain.failed and "part 1 (host " in drain.stats.last_error
    assert not (dest.path("run/mw") / ".metadata").exists() and not (dest.path("run/mw") / MANIFEST_PATH).exists()
    assert [e.path for e in nodes[0].pending()] == [waiting.path]  # left for the next drain, never dropped
