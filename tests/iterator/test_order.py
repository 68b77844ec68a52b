import numpy as np
import pytest

from stager.errors import ConfigError
from stager.iterator.order import EpochOrder, OrderSpec
from stager.iterator.samples import SampleIndex, SampleSpec
from tests.iterator.test_samples import manifest

TOKENS = [50, 120, 7, 300, 90, -1, 64, 210, 33, 150, 80, 99]


def samples_of(order, positions):
    found = order.lookup(positions)
    return list(zip(found.shards.tolist(), found.offsets.tolist()))


@pytest.fixture
def index():
    return SampleIndex(manifest(TOKENS), SampleSpec(10))


def test_an_epoch_visits_every_sample_once(index):
    order = EpochOrder(index, OrderSpec(seed=3, shuffle_window=3), epoch=0)
    got = samples_of(order, np.arange(len(order)))
    expected = [(s, j * 10) for s in index.shards.tolist() for j in range(int(index.counts[s]))]
    assert sorted(got) == sorted(expected)
    assert got != expected  # shuffled


def test_order_depends_only_on_seed_epoch_and_position(index):
    a = EpochOrder(index, OrderSpec(seed=3, shuffle_window=3), epoch=1)
    b = EpochOrder(index, OrderSpec(seed=3, shuffle_window=3), epoch=1)
    positions = np.array([17, 0, 5, len(a) - 1])
    assert samples_of(a, positions) == samples_of(b, np.arange(len(b)))[17:18] + \
        samples_of(b, np.array([0, 5, len(b) - 1]))
    other_epoch = EpochOrder(index, OrderSpec(seed=3, shuffle_window=3), epoch=2)
    other_seed = EpochOrder(index, OrderSpec(seed=4, shuffle_window=3), epoch=1)
    everything = np.arange(len(a))
    assert samples_of(a, everything) != samples_of(other_epoch, everything)
    assert samples_of(a, everything) != samples_of(other_seed, everything)


def test_a_window_of_positions_reads_only_its_window_of_shards(index):
    order = EpochOrder(index, OrderSpec(seed=1, shuffle_window=3), epoch=0)
    found = order.lookup(np.arange(len(order)))
    assert (np.diff(found.windows) >= 0).all()
    for w in range(order.windows):
        shards = set(found.shards[found.windows == w].tolist())
        assert shards == set(order.window_shards(w).tolist())
        assert len(shards) <= 3


@pytest.mark.parametrize("spec", [OrderSpec(seed=3, shuffle_window=3), OrderSpec(seed=5, shuffle_window=1),
                                  OrderSpec(shuffle=False)])
def test_positions_of_one_window_map_as_they_do_among_others(index, spec):
    # A run of positions inside one window (how readers ask) takes a shorter path: same samples.
    order = EpochOrder(index, spec, epoch=2)
    everything = order.lookup(np.arange(len(order)))
    for w in range(order.windows):
        inside = np.arange(order.window_start[w], order.window_start[w + 1])[::-1]
        found = order.lookup(inside)
        assert found.shards.tolist() == everything.shards[inside].tolist()
        assert found.offsets.tolist() == everything.offsets[inside].tolist()
        assert found.windows.tolist() == [w] * len(inside)


def test_unshuffled_is_manifest_order(index):
    order = EpochOrder(index, OrderSpec(shuffle=False), epoch=5)
    got = samples_of(order, np.arange(len(order)))
    assert got == [(s, j * 10) for s in index.shards.tolist() for j in range(int(index.counts[s]))]


def test_bad_specs():
    for kwargs in ({"seed": -1}, {"shuffle_window": 0}, {"shuffle_window": 1.5}):
        with pytest.raises(ConfigError):
            OrderSpec(**kwargs)


def test_positions_outside_the_epoch(index):
    order = EpochOrder(index, OrderSpec(), 0)
    with pytest.raises(IndexError):
        order.lookup(np.array([len(order)]))
