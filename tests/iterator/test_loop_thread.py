import asyncio
import os
import threading

import pytest

from stager.errors import StagerError
from stager.iterator.loop_thread import LoopThread


async def where() -> str:
    await asyncio.sleep(0)
    return threading.current_thread().name


async def fail() -> None:
    raise KeyError("boom")


def test_runs_coroutines_on_its_thread_and_propagates_errors():
    with LoopThread("test-loop") as loop:
        assert loop.run(where()) == "test-loop"
        with pytest.raises(KeyError):
            loop.run(fail())
        with pytest.raises(TimeoutError):
            loop.run(asyncio.sleep(5), timeout=0.05)
    assert not loop.usable
    loop.stop()  # idempotent
    with pytest.raises(StagerError):
        loop.run(where())


def test_a_forked_child_never_uses_the_parents_loop():
    loop = LoopThread()
    try:
        pid = os.fork()
        if pid == 0:  # child: the thread is not here; using it must fail cleanly, stopping must be a no-op
            code = 0
            try:
                if loop.usable:
                    code = 2
                loop.stop()
                try:
                    loop.run(where())
                    code = 3
                except StagerError:
                    pass
                fresh = LoopThread()
                if fresh.run(where()) != "stager-loop":
                    code = 4
                fresh.stop()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert loop.run(where()) == "stager-loop"  # the parent's loop is untouched
    finally:
        loop.stop()
