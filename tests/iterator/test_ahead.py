"""Batches made ahead on a thread: the same stream, the same state, errors where they happened, no leaks."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from stager.errors import ConfigError
from stager.iterator.ahead import made_ahead
from tests.iterator.test_iterator import corpus, iterator  # noqa: F401  (fixture and helper)


def threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def wait_until_gone(name: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while threads_named(name):
        assert time.monotonic() < deadline, f"thread {name} still running"
        time.sleep(0.02)


def test_items_come_in_order_and_an_error_at_its_position():
    def source():
        yield from range(5)
        raise KeyError("the sixth")

    got = []
    with pytest.raises(KeyError, match="the sixth"):
        for item in made_ahead(source(), 2, name="ahead-test-1"):
            got.append(item)
    assert got == [0, 1, 2, 3, 4]
    wait_until_gone("ahead-test-1")
    with pytest.raises(ValueError):
        next(made_ahead(iter([]), 0))


def test_a_consumer_that_stops_early_stops_the_thread_and_closes_the_source():
    closed = threading.Event()

    def endless():
        try:
            n = 0
            while True:
                yield n
                n += 1
        finally:
            closed.set()

    stream = made_ahead(endless(), 3, name="ahead-test-2")
    assert [next(stream) for _ in range(4)] == [0, 1, 2, 3]
    stream.close()
    wait_until_gone("ahead-test-2")
    assert closed.wait(5)


def test_a_stream_made_ahead_is_the_stream_made_on_demand_and_so_is_its_state(corpus, tmp_path):  # noqa: F811
    data, _ = corpus
    settings = dict(batch_size=4, batches=True, dtype=np.int64)
    with iterator(data, tmp_path / "a", ahead=0, **settings) as plain, \
            iterator(data, tmp_path / "b", ahead=3, **settings) as early:
        a, b = iter(plain), iter(early)
        for _ in range(7):
            assert np.array_equal(next(a), next(b))
            time.sleep(0.01)  # let the thread run ahead: the state must not count what it made
            assert early.state_dict() == plain.state_dict()
        state = early.state_dict()
        rest = [x.copy() for x in a]
    wait_until_gone("stager-batches")  # closing the iterator stopped the thread of the stream left open
    with iterator(data, tmp_path / "b", ahead=3, **settings) as resumed:
        resumed.load_state_dict(state)
        again = list(resumed)
    assert len(again) == len(rest) and all(np.array_equal(x, y) for x, y in zip(again, rest))


def test_ahead_must_be_a_count(corpus, tmp_path):  # noqa: F811
    data, _ = corpus
    with pytest.raises(ConfigError, match="ahead"):
        iterator(data, tmp_path / "c", ahead=-1)


def test_a_superseded_or_closed_stream_stops_its_thread_and_says_so(corpus, tmp_path):  # noqa: F811
    data, _ = corpus
    with iterator(data, tmp_path / "d", batch_size=4, batches=True, ahead=2) as it:
        old = iter(it)
        next(old)
        new = iter(it)  # supersedes the first stream
        with pytest.raises(Exception, match="superseded"):
            for _ in range(1000):  # the batches already made may still come; then it says so
                next(old)
        next(new)
        it.close()
        wait_until_gone("stager-batches")
