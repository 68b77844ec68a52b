"""The soft limit of open files: raised by the command, and what the engine's concurrency ceiling makes of it.

Each case runs in a child process given its limits first (the test process keeps its own).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

# Given (soft, hard) limits, prints what raise_soft_limit and request_ceiling make of them.
CHILD = """
import json, resource, sys
from stager.open_files import raise_soft_limit, request_ceiling
ceilings = {n: request_ceiling(2048, descriptors_per_blob=n) for n in (1, 2)}
small = request_ceiling(16)
raised = raise_soft_limit()
print(json.dumps({"before": ceilings, "small": small, "raised": raised,
                  "after": list(resource.getrlimit(resource.RLIMIT_NOFILE)), "ceiling_after": request_ceiling(2048)}))
"""


def child(soft: int, hard: int) -> dict:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True,
                         preexec_fn=limit).stdout
    return json.loads(out)


def test_the_ceiling_leaves_room_for_a_socket_and_two_blobs_files_per_request_then_rises_with_the_limit():
    seen = child(512, 4096)
    # (512 - 128 reserved) / (socket + 2 blobs x 1 file), and x 2 files with direct writes
    assert seen["before"] == {"1": 128, "2": 76}
    assert seen["small"] == 16  # a ceiling that fits stays as configured
    assert seen["raised"] == 4096 and seen["after"] == [4096, 4096]
    assert seen["ceiling_after"] == (4096 - 128) // 3


def test_a_soft_limit_already_at_the_hard_one_stays():
    seen = child(300, 300)
    assert seen["raised"] == 300 and seen["after"] == [300, 300]
    assert seen["ceiling_after"] == (300 - 128) // 3
