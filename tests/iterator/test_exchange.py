"""The workers' swap of resume-state parts, between real processes."""

import multiprocessing
import os
import queue
import secrets
import signal
import time

import pytest

from stager.errors import StagerError
from stager.iterator.exchange import exchange

FORK = multiprocessing.get_context("fork")


def member(name, k, members, payload, timeout, out):
    try:
        out.put((k, exchange(name, k, members, payload, timeout)))
    except StagerError as exc:
        out.put((k, f"error: {exc}"))


def run(members, payloads, timeout, name=None):
    name = name or secrets.token_hex(8)
    out = FORK.Queue()
    procs = [FORK.Process(target=member, args=(name, k, members, p, timeout, out)) for k, p in payloads.items()]
    for proc in procs:
        proc.start()
    try:
        return dict(out.get(timeout=timeout + 30) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


def test_every_member_gets_every_payload_in_member_order():
    payloads = {0: {"format": "x", "progress": {"0": 8}}, 1: None, 2: [1, 2, 3]}
    got = run(3, payloads, 30)
    assert got == {k: [payloads[0], None, [1, 2, 3]] for k in range(3)}


def test_a_member_that_never_comes_fails_the_others_within_the_timeout():
    began = time.monotonic()
    got = run(3, {0: "a", 2: "c"}, 2)
    assert all(v.startswith("error: ") and "not every worker" in v for v in got.values()), got
    assert time.monotonic() - began < 20


def test_one_member_needs_no_one():
    assert exchange(secrets.token_hex(8), 0, 1, {"a": 1}, 0.01) == [{"a": 1}]


def test_groups_with_other_names_do_not_mix():
    name_a, name_b = secrets.token_hex(8), secrets.token_hex(8)
    out = FORK.Queue()
    procs = [FORK.Process(target=member, args=(name, k, 2, f"{name}-{k}", 30, out))
             for name in (name_a, name_b) for k in range(2)]
    for proc in procs:
        proc.start()
    try:
        got = [out.get(timeout=60) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=30)
    for _, everyone in got:
        assert everyone in ([f"{name_a}-0", f"{name_a}-1"], [f"{name_b}-0", f"{name_b}-1"])


def loader_process(name, out):
    """A loader's process: starts one worker that waits for a second one, then dies at once."""
    worker = FORK.Process(target=member, args=(name, 0, 2, "a", 60, out))
    worker.start()
    out.put(("worker pid", worker.pid))
    time.sleep(0.5)  # the worker is waiting in the exchange by now
    os._exit(3)


def test_a_worker_whose_loader_process_died_gives_up_within_seconds():
    """A job that dies while its loader's workers meet (a crash, or its exit on another worker's error)
    must not leave them waiting out the whole deadline (60 s here) holding what they hold."""
    out = FORK.Queue()
    loader = FORK.Process(target=loader_process, args=(secrets.token_hex(8), out))
    loader.start()
    worker_pid = None
    try:
        label, worker_pid = out.get(timeout=30)
        assert label == "worker pid"
        loader.join(timeout=30)
        died = time.monotonic()
        try:
            k, result = out.get(timeout=20)
        except queue.Empty:
            raise AssertionError("the worker still waited 20 s after its loader's process died") from None
        assert k == 0 and result.startswith("error: ") and "the loader's process is gone" in result, result
        assert time.monotonic() - died < 10
    finally:
        if worker_pid is not None:
            try:
                os.kill(worker_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
