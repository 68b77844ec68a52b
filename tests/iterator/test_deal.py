import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stager.errors import ConfigError
from stager.iterator.deal import Layout, Remainder, Slice, redeal

shapes = st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(1, 5))


def slices(remainder, shape):
    world, workers, batch = shape
    return {(r, k): Slice(remainder, Layout(world, r, workers, k, batch))
            for r in range(world) for k in range(workers)}


def read(piece, count):
    return piece.positions(0, count).tolist()


@given(st.integers(0, 300), shapes)
@settings(max_examples=80, deadline=None)
def test_consumers_partition_the_epoch(total, shape):
    everything = []
    for piece in slices(Remainder.whole(total), shape).values():
        everything += read(piece, len(piece))
    assert sorted(everything) == list(range(total))


@given(st.integers(1, 300), shapes, st.data())
@settings(max_examples=80, deadline=None)
def test_after_n_steps_on_every_rank_a_prefix_is_read(total, shape, data):
    world, workers, batch = shape
    steps = data.draw(st.integers(0, total // (world * batch)))
    seen = []
    for (r, k), piece in slices(Remainder.whole(total), shape).items():
        mine = len(range(k, steps, workers))  # the loader asks worker t % workers at step t
        seen += read(piece, mine * batch)
    assert sorted(seen) == list(range(steps * world * batch))


@given(st.integers(0, 200), shapes, shapes, st.data())
@settings(max_examples=120, deadline=None)
def test_redeal_leaves_exactly_what_was_not_read(total, old, new, data):
    world, workers, batch = old
    remainder = Remainder.whole(total)
    # Any progress at all, not only step boundaries: a chained resume on a third shape must still work.
    progress = {k: data.draw(st.integers(0, len(Slice(remainder, Layout(world, 0, workers, k, batch)))))
                for k in range(workers)}
    seen = []
    for (r, k), piece in slices(remainder, old).items():
        seen += read(piece, progress[k])
    rest = redeal(remainder, old, progress)
    later = []
    for piece in slices(rest, new).values():
        later += read(piece, len(piece))
    assert sorted(later) == sorted(set(range(total)) - set(seen))
    assert len(later) == len(set(later))


def test_redeal_needs_every_worker():
    with pytest.raises(ConfigError, match="missing"):
        redeal(Remainder.whole(100), (1, 2, 1), {0: 5})


def test_truncated_keeps_whole_steps():
    rem = Remainder(np.array([3, 7]), 10, 15)
    assert len(rem.truncated(4)) == 4
    assert rem.truncated(4).positions(np.arange(4)).tolist() == [3, 7, 10, 11]
    assert len(rem.truncated(3)) == 6
    assert len(Remainder.whole(10).truncated(20)) == 0


def test_layout_and_remainder_validation():
    with pytest.raises(ConfigError):
        Layout(world=2, rank=2)
    with pytest.raises(ConfigError):
        Layout(workers=0)
    with pytest.raises(ConfigError):
        Remainder(np.array([5, 3]), 10, 20)
    with pytest.raises(ConfigError):
        Remainder(np.array([12]), 10, 20)
