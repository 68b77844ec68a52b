"""Batches made ahead: the source's order exactly, errors in place, a bounded queue, a helper that stops."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stager.iterator.ahead import AWAY_MIN, MadeAhead

ROOT = Path(__file__).resolve().parents[2]
STEP = 3 * AWAY_MIN  # a consumer "computing" this long between calls gets help


class Recording:
    """A source of 0..n-1 that notes which thread made each item and when it was closed."""

    def __init__(self, n: int, fail_at: int | None = None, cost: float = 0.0) -> None:
        self.n, self.fail_at, self.cost = n, fail_at, cost
        self.makers: list[str] = []
        self.made = 0
        self.closed = threading.Event()

    def __iter__(self):
        try:
            for i in range(self.n):
                if i == self.fail_at:
                    raise ValueError(f"item {i} cannot be made")
                time.sleep(self.cost)
                self.makers.append(threading.current_thread().name)
                self.made += 1
                yield i
        finally:
            self.closed.set()


def consume(ahead, step: float, limit: int = 10_000) -> list:
    out = []
    for _ in range(limit):
        try:
            out.append(next(ahead))
        except StopIteration:
            return out
        time.sleep(step)
    raise AssertionError("the source never ended")


def test_a_consumer_that_computes_gets_the_sources_order_made_by_the_helper():
    source = Recording(60)
    ahead = MadeAhead(iter(source), depth=4, name="maker")
    try:
        assert consume(ahead, STEP) == list(range(60))
    finally:
        ahead.close()
    assert source.makers.count("maker") > 30, source.makers  # most made ahead, off the consumer's path


def test_a_tight_loop_makes_every_item_itself():
    source = Recording(200)
    ahead = MadeAhead(iter(source), depth=4, name="maker")
    try:
        assert consume(ahead, 0.0) == list(range(200))
    finally:
        ahead.close()
    assert "maker" not in source.makers  # no GIL traded with a helper for a consumer that never leaves


def test_made_ahead_never_exceeds_the_depth():
    source = Recording(40)
    ahead = MadeAhead(iter(source), depth=3)
    taken = 0
    try:
        for _ in range(40):
            next(ahead)
            taken += 1
            time.sleep(STEP)
            assert source.made - taken <= 3
    finally:
        ahead.close()


def test_an_error_comes_in_its_place_then_the_stream_ends():
    source = Recording(10, fail_at=6)
    ahead = MadeAhead(iter(source), depth=4)
    try:
        got = []
        with pytest.raises(ValueError, match="item 6"):
            for _ in range(10):
                got.append(next(ahead))
                time.sleep(STEP)
        assert got == list(range(6))
        with pytest.raises(StopIteration):
            next(ahead)
    finally:
        ahead.close()


def test_close_stops_the_helper_and_closes_the_source_mid_stream():
    source = Recording(1000, cost=0.001)
    ahead = MadeAhead(iter(source), depth=4, name="maker")
    for _ in range(10):
        next(ahead)
        time.sleep(STEP)
    ahead.close()
    assert source.closed.is_set()
    made = source.made
    time.sleep(0.05)
    assert source.made == made  # nothing more is made after close
    assert not any(t.name == "maker" for t in threading.enumerate())
    with pytest.raises(StopIteration):
        next(ahead)


def test_a_helper_left_running_is_stopped_before_the_interpreter_exits(tmp_path):
    # A training loop that breaks out of its batches leaves the helper alive; at exit it must be stopped
    # before finalization (a daemon thread unwound inside C++ code aborts the process), its source closed.
    script = tmp_path / "left_running.py"
    script.write_text(
        "import itertools, sys, time\n"
        "from stager.iterator.ahead import MadeAhead\n"
        "def source():\n"
        "    try:\n"
        "        for i in itertools.count():\n"
        "            time.sleep(0.001)\n"
        "            yield i\n"
        "    finally:\n"
        "        sys.stdout.write('source closed\\n'); sys.stdout.flush()\n"
        "made = MadeAhead(source(), depth=4)\n"
        "for item in made:\n"
        "    time.sleep(0.005)  # away long enough for the helper to work\n"
        "    if item == 20:\n"
        "        break\n"
        "keep = made  # still referenced at exit: only the exit hook can stop it\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("source closed") == 1
