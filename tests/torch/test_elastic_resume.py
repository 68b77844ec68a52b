"""Resuming through ``StatefulDataLoader.load_state_dict`` in new processes, at another worker count or world size.

Each test saves mid-epoch in a training process, kills it with SIGKILL, resumes in new processes the way
a user would (``loader.load_state_dict(state)``, with torchdata's loader or ``stager.torch``'s), and checks
the part before the save plus the resumed streams hold every sample of the epoch exactly once.
"""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata")

from tests.iterator.corpus import expected_firsts, write_counting_corpus  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LENGTHS = [400 + 37 * i for i in range(20)]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic")
    return root / "data", write_counting_corpus(root / "data", LENGTHS)


@pytest.fixture(scope="module")
def saved(corpus, tmp_path_factory):
    """saved(workers[, snapshot_every]) -> (state, batches read before it): one killed job each, shared."""
    data, _ = corpus
    root = tmp_path_factory.mktemp("saved")
    jobs = {}

    def get(workers: int, snapshot_every: int = 1):
        if (workers, snapshot_every) not in jobs:
            first = root / f"first-{workers}-{snapshot_every}.json"
            state = save_mid_epoch(data, root / "cache", first, workers=workers, steps=7,
                                   snapshot_every=snapshot_every)
            jobs[workers, snapshot_every] = state, read(first)
        return jobs[workers, snapshot_every]
    return get


def command(data, cache, out, *args) -> list[str]:
    return [sys.executable, "-m", "tests.torch.elastic_worker", str(data), str(cache), str(out), *map(str, args)]


def save_mid_epoch(data, cache, out: Path, workers: int, steps: int, snapshot_every: int = 1) -> Path:
    """Run a one-rank job until it checkpoints after ``steps`` steps, kill it, return the state's path."""
    args = ["--workers", workers, "--steps", steps, "--snapshot-every", snapshot_every]
    proc = subprocess.Popen(command(data, cache, out, *args), env=ENV, cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.exists(), "the first process never checkpointed"
    finally:
        _kill_session(proc)  # the process and its loader workers
        proc.wait(timeout=30)
    return Path(str(out) + ".state")


def resume(data, cache, outs: list[Path], state: Path, workers: int, *extra, timeout: float = 120):
    """Start one resumed process per entry of ``outs`` (ranks of one gloo group if more than one)."""
    world = len(outs)
    procs = []
    for rank, out in enumerate(outs):
        args = ["--workers", workers, "--load", state, *extra]
        if world > 1:
            args += ["--world", world, "--rank", rank, "--store", out.parent / "pg-store"]
        procs.append(subprocess.Popen(command(data, cache, out, *args), env=ENV, cwd=REPO, start_new_session=True,
                                      stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for proc in procs:
            try:
                _, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                if proc.poll() is None:
                    raise
                # The job has ended, but a loader worker of it lives on holding its stderr: torchdata's
                # worker takes its parent's pid for its watchdog only once its start-up is over, so a
                # worker still starting when the job exits never sees it go (one was found alive 41
                # minutes later). The job's own exit is what is judged here; its orphans are reaped.
                _kill_session(proc)
                _, err = proc.communicate(timeout=30)
            results.append((proc.returncode, err))
    finally:
        for proc in procs:  # also a job that has exited: workers it left behind share its session
            _kill_session(proc)
            if proc.poll() is None:
                proc.wait(timeout=30)
    return results


def _kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the job and everything it started are gone
        pass


def read(path: Path) -> list[list[int]]:
    return json.loads(path.read_text())


def assert_whole_epoch_once(manifest, *parts):
    seen = Counter(first for part in parts for batch in part for first in batch)
    expected = expected_firsts(manifest, 16)
    assert not [f for f, n in seen.items() if n > 1], "samples read twice"
    assert set(seen) == expected, f"{len(expected - set(seen))} samples never read"


@pytest.mark.parametrize("before, after", [(2, 1), (1, 3)])
def test_another_worker_count_through_the_loader_fails_at_once_naming_the_way_that_works(corpus, saved, tmp_path,
                                                                                        before, after):
    data, _ = corpus
    state, _ = saved(before)
    [(code, err)] = resume(data, tmp_path / "cache", [tmp_path / "second.json"], state, after)
    assert code == 3 and f"saved with num_workers={before}" in err and "stager.torch.StatefulDataLoader" in err, err


@pytest.mark.parametrize("before, after", [(2, 1), (1, 3)])
def test_another_worker_count_through_the_dataset(corpus, saved, tmp_path, before, after):
    data, manifest = corpus
    state, first = saved(before)
    [(code, err)] = resume(data, tmp_path / "cache", [tmp_path / "second.json"], state, after, "--via", "dataset")
    assert code == 0, err
    assert_whole_epoch_once(manifest, first, read(tmp_path / "second.json"))


@pytest.mark.parametrize("via", ["loader", "both"])
def test_world_one_to_two_through_the_loader(corpus, saved, tmp_path, via):
    data, manifest = corpus
    state, first = saved(2)
    outs = [tmp_path / "rank0.json", tmp_path / "rank1.json"]
    results = resume(data, tmp_path / "cache", outs, state, 2, "--via", via)
    assert [code for code, _ in results] == [0, 0], results
    assert_whole_epoch_once(manifest, first, *map(read, outs))


def test_a_state_no_rank_can_resume_fails_every_rank_within_seconds(corpus, saved, tmp_path):
    data, _ = corpus
    state, _ = saved(2)
    outs = [tmp_path / "rank0.json", tmp_path / "rank1.json"]
    began = time.monotonic()
    results = resume(data, tmp_path / "cache", outs, state, 1)  # 2 -> 1 workers through the loader: refused
    assert [code for code, _ in results] == [3, 3], results
    assert all("saved with num_workers=2" in err for _, err in results), results
    assert time.monotonic() - began < 60  # a rank left waiting at the barrier would have waited 120 s


STAGER = ("--loader", "stager")


@pytest.mark.parametrize("before, after", [(2, 1), (1, 3), (2, 0), (0, 2)])
def test_another_worker_count_through_stagers_loader(corpus, saved, tmp_path, before, after):
    data, manifest = corpus
    state, first = saved(before)
    [(code, err)] = resume(data, tmp_path / "cache", [tmp_path / "second.json"], state, after, *STAGER)
    assert code == 0, err
    assert_whole_epoch_once(manifest, first, read(tmp_path / "second.json"))


def test_the_same_config_through_stagers_loader_is_the_uninterrupted_stream(corpus, saved, tmp_path):
    data, _ = corpus
    state, first = saved(2)
    whole = tmp_path / "whole.json"
    subprocess.run(command(data, tmp_path / "cache", whole, "--workers", 2), env=ENV, cwd=REPO, check=True,
                   timeout=120)
    [(code, err)] = resume(data, tmp_path / "cache", [tmp_path / "second.json"], state, 2, *STAGER)
    assert code == 0, err
    assert first + read(tmp_path / "second.json") == read(whole)


@pytest.mark.parametrize("workers_after", [2, 1])
def test_world_one_to_two_through_stagers_loader(corpus, saved, tmp_path, workers_after):
    data, manifest = corpus
    state, first = saved(2)
    outs = [tmp_path / "rank0.json", tmp_path / "rank1.json"]
    results = resume(data, tmp_path / "cache", outs, state, workers_after, *STAGER)
    assert [code for code, _ in results] == [0, 0], results
    assert_whole_epoch_once(manifest, first, *map(read, outs))


@pytest.mark.parametrize("workers_after, world_after", [(1, 1), (2, 2)])
def test_a_state_saved_between_snapshots_re_deals_through_stagers_loader(corpus, saved, tmp_path, workers_after,
                                                                         world_after):
    """Saved 1 step after a snapshot (every 3 steps): the step is credited, not replayed on re-dealt data."""
    data, manifest = corpus
    state, first = saved(2, 3)
    assert torch.load(state, weights_only=False)["_steps_since_snapshot"] == 1  # 7 steps, snapshots at 3 and 6
    outs = [tmp_path / f"rank{r}.json" for r in range(world_after)]
    results = resume(data, tmp_path / "cache", outs, state, workers_after, *STAGER, "--snapshot-every", 3)
    assert [code for code, _ in results] == [0] * world_after, results
    assert_whole_epoch_once(manifest, first, *map(read, outs))
