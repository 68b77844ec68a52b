import json

import numpy as np
import pytest

from stager.errors import ConfigError
from stager.iterator.deal import Layout, Remainder, Slice, redeal
from stager.iterator.state import StreamState, from_loader_state, gather, merge


def state(progress, shape=(2, 2, 4), epoch=1):
    return StreamState("f" * 16, 7, True, 8, epoch, Remainder(np.array([1, 5]), 9, 100), shape, progress)


def test_round_trip_through_json():
    s = state({0: 12, 1: 8})
    d = json.loads(json.dumps(s.to_dict()))
    assert StreamState.from_dict(d) == s
    assert d["position"] == s.position()


def test_position_is_the_read_prefix():
    s = state({0: 8, 1: 4})  # worker 1 did one step of 4, worker 0 two: one full round of 2 ranks x 2 workers
    assert s.position() == int(Remainder(np.array([1, 5]), 9, 100).positions(np.array([16]))[0])


@pytest.mark.parametrize("bad", [
    {}, {"format": "other"}, {**state({0: 1}).to_dict(), "version": 99},
    {**state({0: 1}).to_dict(), "world": 0}, {**state({0: 1}).to_dict(), "leftover": [5, 3]},
    {k: v for k, v in state({0: 1}).to_dict().items() if k != "tail"},
])
def test_malformed_states_are_config_errors(bad):
    with pytest.raises(ConfigError):
        StreamState.from_dict(bad)


def test_a_version_1_state_parses_as_an_unstriped_epoch_and_says_so_again():
    old = StreamState.from_dict({**state({0: 1}).to_dict(), "version": 1})
    assert not old.striped and old.to_dict()["version"] == 1
    assert StreamState.from_dict(state({0: 1}).to_dict()).striped


def test_check_refuses_other_streams():
    s = state({0: 1})
    s.check("f" * 16, 7, True, 8)
    with pytest.raises(ConfigError, match="another dataset"):
        s.check("e" * 16, 7, True, 8)
    with pytest.raises(ConfigError, match="seed"):
        s.check("f" * 16, 8, True, 8)


def test_same_shape_continues_each_worker_other_shape_redeals():
    s = state({0: 8, 1: 4})
    assert s.resume(Layout(2, 1, 2, 1, 4)) == (s.remainder, 4)
    rest, done = s.resume(Layout(3, 0, 1, 0, 4))
    assert done == 0 and len(rest) == len(s.remainder) - 2 * (8 + 4)


def test_merge_and_loader_states():
    w0, w1 = state({0: 8}), state({1: 4})
    assert merge([w0, w1]).progress == {0: 8, 1: 4}
    with pytest.raises(ConfigError):
        merge([w0, state({1: 4}, epoch=2)])
    loader = {"_snapshot": {"_last_yielded_worker_id": 0, "_worker_snapshots": {
        "worker_0": {"worker_id": 0, "dataset_state": w0.to_dict(), "fetcher_state": None},
        "worker_1": {"worker_id": 1, "dataset_state": w1.to_dict(), "fetcher_state": None}}},
        "_steps_since_snapshot": 1}
    got = from_loader_state(loader)
    assert got.progress == {0: 8, 1: 8}  # the step after the snapshot came from worker 1
    single = {"_num_yielded": 3, "dataset_state": w0.to_dict()}
    assert from_loader_state(single) == w0
    assert from_loader_state({"_snapshot": {"_worker_snapshots": {"worker_0": None}}}) is None


def test_gather_unites_the_parts_handed_to_a_new_loaders_workers():
    w0, w1 = state({0: 8}), state({1: 4})
    assert gather([w0.to_dict(), w1.to_dict(), None], None).progress == {0: 8, 1: 4}
    assert gather([None, None], None) is None
    whole = merge([w0, w1])
    assert gather([None, None], whole) == whole  # given to the dataset only
    assert gather([w0.to_dict(), w1.to_dict()], whole) == whole  # both ways, the same snapshot
    with pytest.raises(ConfigError, match="worker 0's progress"):
        gather([state({0: 12}).to_dict(), None], whole)  # the dataset and the loader got other snapshots
    with pytest.raises(ConfigError, match="disagree"):
        gather([w0.to_dict(), state({1: 4}, epoch=2).to_dict()], None)


def test_loader_states_skip_worker_entries_beyond_the_loaders_count_and_refuse_non_dicts():
    w0, stale = state({0: 8}, shape=(2, 1, 4)), state({1: 4})
    loader = {"_snapshot": {"_last_yielded_worker_id": 0, "_main_snapshot": {"_num_workers": 1},
                            "_worker_snapshots": {"worker_0": {"dataset_state": w0.to_dict()},
                                                  "worker_1": {"dataset_state": stale.to_dict()}}},
              "_steps_since_snapshot": 0}
    assert from_loader_state(loader) == w0
    with pytest.raises(ConfigError, match="must be a dict"):
        from_loader_state([1, 2])


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shape", [(2, 2, 4), (3, 2, 5), (2, 3, 1)])
def test_rank_0s_progress_re_deals_to_exactly_what_no_rank_has_read(shape, drop_last):
    """Ranks step together: after n steps on every rank (fewer on a rank whose slice ended), rank 0's
    per-worker progress re-deals to exactly the positions no rank has read, with drop_last either way.
    Every rank's does while every rank still has data; at the very end of an epoch without drop_last a rank
    whose slice ended first lags, while rank 0, which takes the first chunk of every step, never does."""
    world, workers, batch = shape
    remainder = Remainder(np.array([3, 7, 8]), 20, 138)  # 121 positions: ranks end unevenly, the last chunk short
    if drop_last:
        remainder = remainder.truncated(world * batch)
    pieces = {(r, k): Slice(remainder, Layout(world, r, workers, k, batch))
              for r in range(world) for k in range(workers)}
    everything = sorted(remainder.positions(np.arange(len(remainder))).tolist())
    steps_min = min(-(-len(p) // batch) for p in pieces.values()) * workers
    steps_max = max(-(-len(p) // batch) for p in pieces.values()) * workers
    for steps in range(steps_max + 1):
        read, rests = [], []
        for r in range(world):
            progress = {k: min(len(range(k, steps, workers)) * batch, len(pieces[r, k])) for k in range(workers)}
            read += [int(x) for k in range(workers) for x in pieces[r, k].positions(0, progress[k])]
            rests.append(redeal(remainder, shape, progress))
        assert sorted(read + rests[0].positions(np.arange(len(rests[0]))).tolist()) == everything
        if steps <= steps_min:
            assert all(rest == rests[0] for rest in rests), f"ranks disagree after {steps} steps"


def test_complete_means_every_dealt_worker_s_progress_is_there():
    assert not state({0: 8}).complete  # one worker's part of a 2-worker loader: not enough to re-deal
    assert merge([state({0: 8}), state({1: 4})]).complete
    assert state({0: 8}, shape=(2, 1, 4)).complete
