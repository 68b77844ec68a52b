import json

import numpy as np
import pytest

from stager.errors import ConfigError
from stager.iterator.deal import Layout, Remainder
from stager.iterator.state import StreamState, from_loader_state, merge


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
