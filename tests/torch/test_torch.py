"""TokenDataset in torch DataLoaders (with worker processes), StatefulDataLoader resume, and no-torch imports."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata")

from torch.utils.data import DataLoader  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

from stager.errors import ConfigError  # noqa: E402
from stager.torch import StatefulDataLoader as StagerLoader  # noqa: E402
from stager.torch import reshaped_loader_state  # noqa: E402
from tests.iterator.corpus import check_sample, expected_firsts, write_counting_corpus  # noqa: E402
from tests.torch.loader_worker import BATCH, loader, make  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LENGTHS = [400 + 37 * i for i in range(20)]


@pytest.fixture
def corpus(tmp_path):
    return tmp_path / "data", write_counting_corpus(tmp_path / "data", LENGTHS)


def firsts(batch) -> list[int]:
    assert batch.dtype == torch.int64
    return [check_sample(row.numpy(), 16) for row in batch]


def test_two_ranks_of_two_workers_cover_the_epoch_once(corpus, tmp_path):
    data, manifest = corpus
    seen = []
    for rank in range(2):
        ds = make(str(data), str(tmp_path / "cache"), rank=rank, world_size=2)
        for batch in DataLoader(ds, batch_size=BATCH, num_workers=2):
            seen += firsts(batch)
    assert sorted(seen) == sorted(expected_firsts(manifest, 16))


def test_single_process_state_dict_resumes_exactly(corpus, tmp_path):
    data, _ = corpus
    ds = make(str(data), str(tmp_path / "cache"))
    whole = [firsts(b) for b in DataLoader(ds, batch_size=BATCH)]
    ds = make(str(data), str(tmp_path / "cache"))
    head = []
    for batch in DataLoader(ds, batch_size=BATCH):
        head.append(firsts(batch))
        if len(head) == 5:
            break
    state = ds.state_dict()
    again = make(str(data), str(tmp_path / "cache"))
    again.load_state_dict(state)
    tail = [firsts(b) for b in DataLoader(again, batch_size=BATCH)]
    assert head + tail == whole
    assert again.epoch == 1  # finishing the epoch moved the dataset on


def test_stateful_loader_resumed_in_a_new_process_after_a_kill_equals_the_uninterrupted_stream(corpus, tmp_path):
    data, _ = corpus
    whole = [b[:, 0].tolist() for b in loader(make(str(data), str(tmp_path / "cache-whole")))]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first_out, second_out = tmp_path / "first.json", tmp_path / "second.json"
    cache = str(tmp_path / "cache")
    proc = subprocess.Popen([sys.executable, "-m", "tests.torch.loader_worker", str(data), cache, "-",
                             str(first_out), "7"], env=env, cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not first_out.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first_out.exists(), "the first process never checkpointed"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the process and its loader workers
        proc.wait(timeout=30)
    subprocess.run([sys.executable, "-m", "tests.torch.loader_worker", str(data), cache, str(first_out) + ".state",
                    str(second_out), "-1"], env=env, cwd=REPO, check=True, timeout=180)
    first = json.loads(first_out.read_text())
    second = json.loads(second_out.read_text())
    assert len(first) == 7
    assert first + second == whole


def test_resume_at_world_size_three_from_a_loader_state_saved_at_two(corpus, tmp_path):
    data, manifest = corpus
    cache = str(tmp_path / "cache")
    seen, states = [], []
    for rank in range(2):  # each rank of the old job takes 5 steps, with 2 workers each
        dl = loader(make(str(data), cache, rank=rank, world_size=2))
        for step, batch in enumerate(dl):
            seen += firsts(batch)
            if step == 4:
                break
        states.append(dl.state_dict())
        del dl
    for rank in range(3):  # the new job: 3 ranks, 1 worker each, from rank 0's checkpoint
        ds = make(str(data), cache, rank=rank, world_size=3)
        ds.load_state_dict(states[0])
        for batch in StatefulDataLoader(ds, batch_size=BATCH, num_workers=1):
            seen += firsts(batch)
    assert sorted(seen) == sorted(expected_firsts(manifest, 16))


def test_resume_at_world_size_three_through_each_new_loaders_load_state_dict(corpus, tmp_path):
    data, manifest = corpus
    cache = str(tmp_path / "cache")
    seen, states = [], []
    for rank in range(2):  # each rank of the old job takes 5 steps, with 2 workers each
        dl = loader(make(str(data), cache, rank=rank, world_size=2))
        for step, batch in enumerate(dl):
            seen += firsts(batch)
            if step == 4:
                break
        states.append(dl.state_dict())
        del dl
    for rank in range(3):  # the new job: 3 ranks, the same 2 workers, the standard call with rank 0's state
        dl = loader(make(str(data), cache, rank=rank, world_size=3))
        dl.load_state_dict(states[0])
        for batch in dl:
            seen += firsts(batch)
    assert sorted(seen) == sorted(expected_firsts(manifest, 16))


def test_world_two_to_three_and_two_workers_to_none_through_stagers_loader(corpus, tmp_path):
    data, manifest = corpus
    cache = str(tmp_path / "cache")
    seen, states = [], []
    for rank in range(2):  # each rank of the old job takes 5 steps, with 2 workers each
        dl = loader(make(str(data), cache, rank=rank, world_size=2))
        for step, batch in enumerate(dl):
            seen += firsts(batch)
            if step == 4:
                break
        states.append(dl.state_dict())
        del dl
    for rank in range(3):  # the new job: 3 ranks without workers, the standard call with rank 0's state
        dl = StagerLoader(make(str(data), cache, rank=rank, world_size=3), batch_size=BATCH, num_workers=0)
        dl.load_state_dict(states[0])
        for batch in dl:
            seen += firsts(batch)
    assert sorted(seen) == sorted(expected_firsts(manifest, 16))


def test_a_state_saved_after_a_reshaped_resume_resumes_again_at_yet_another_worker_count(corpus, tmp_path):
    data, manifest = corpus
    cache = str(tmp_path / "cache")
    seen, state = [], None
    for workers in (2, 1, 3, 0):  # each job takes 3 steps (the last reads the rest), then the next resumes
        dl = StagerLoader(make(str(data), cache), batch_size=BATCH, num_workers=workers)
        if state is not None:
            dl.load_state_dict(state)
        for step, batch in enumerate(dl):
            seen += firsts(batch)
            if step == 2 and workers:
                break
        state = dl.state_dict()
        del dl
    assert sorted(seen) == sorted(expected_firsts(manifest, 16))


def test_stagers_loader_passes_a_state_of_the_same_dealing_or_of_another_dataset_through_untouched(corpus,
                                                                                                   tmp_path):
    data, _ = corpus
    ds = make(str(data), str(tmp_path / "cache"))
    dl = StagerLoader(ds, batch_size=BATCH, num_workers=0)
    for step, _batch in enumerate(dl):
        if step == 2:
            break
    state = dl.state_dict()
    assert reshaped_loader_state(state, ds, 0) is state
    assert reshaped_loader_state(state, list(range(8)), 2) is state  # not a TokenDataset: torchdata's business
    assert reshaped_loader_state({}, ds, 2) == {}


@pytest.mark.parametrize("drop", ["_num_yielded", "_shared_seed"])
def test_stagers_loader_refuses_a_state_of_an_unknown_shape_in_one_line(corpus, tmp_path, drop):
    data, _ = corpus
    ds = make(str(data), str(tmp_path / "cache"))
    dl = StagerLoader(ds, batch_size=BATCH, num_workers=0)
    for step, _batch in enumerate(dl):
        if step == 2:
            break
    state = {k: v for k, v in dl.state_dict().items() if k != drop}  # as another torchdata version might name it
    with pytest.raises(ConfigError, match=f"not shaped like a torchdata StatefulDataLoader state.*{drop}"):
        StagerLoader(ds, batch_size=BATCH, num_workers=2).load_state_dict(state)


def test_batched_mode_and_len(corpus, tmp_path):
    data, manifest = corpus
    ds = make(str(data), str(tmp_path / "cache"), batches=True)
    batches = list(DataLoader(ds, batch_size=None))
    assert len(batches) == len(ds)
    assert sorted(f for b in batches for f in firsts(b)) == sorted(expected_firsts(manifest, 16))


def test_stager_imports_without_torch(tmp_path):
    script = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import stager, stager.iterator\n"
        "assert stager.TokenIterator is stager.iterator.TokenIterator\n"
        "assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules)\n"
        "try:\n"
        "    import stager.torch\n"
        "except ImportError:\n"
        "    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
