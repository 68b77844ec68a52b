"""Keeping a process's threads on one CPU: in child processes, each given a set of CPUs first."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CPUS = sorted(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")

# Given CPUs, calls keep_on_one_cpu(wanted), starts a thread, prints what each thread may run on.
CHILD = """
import json, os, sys, threading
from stager.one_cpu import keep_on_one_cpu
os.sched_setaffinity(0, set(json.loads(sys.argv[1])))
pinned = keep_on_one_cpu(json.loads(sys.argv[2]))
seen = {}
thread = threading.Thread(target=lambda: seen.update(thread=sorted(os.sched_getaffinity(0))))
thread.start()
thread.join()
print(json.dumps({"pinned": pinned, "main": sorted(os.sched_getaffinity(0)), **seen}))
"""


def child(cpus: list[int], wanted: bool | None) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cpus), json.dumps(wanted)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return json.loads(out)


@needs_two
def test_on_two_cpus_the_thread_and_those_it_starts_keep_to_one_of_them():
    two = CPUS[:2]
    seen = child(two, None)
    assert seen["pinned"] in two
    assert seen["main"] == seen["thread"] == [seen["pinned"]]


@needs_two
def test_asked_not_to_the_threads_keep_every_cpu():
    seen = child(CPUS[:2], False)
    assert seen == {"pinned": None, "main": CPUS[:2], "thread": CPUS[:2]}


def test_one_cpu_is_left_as_it_is():
    seen = child(CPUS[:1], True)
    assert seen == {"pinned": None, "main": CPUS[:1], "thread": CPUS[:1]}


@pytest.mark.skipif(len(CPUS) < 3, reason="needs three CPUs")
def test_more_than_two_cpus_are_kept_unless_asked():
    assert child(CPUS[:3], None) == {"pinned": None, "main": CPUS[:3], "thread": CPUS[:3]}
    asked = child(CPUS[:3], True)
    assert asked["main"] == asked["thread"] == [asked["pinned"]]
