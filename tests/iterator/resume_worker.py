"""A training process for the resume test: reads batches, checkpoints after N steps, then waits to be killed.

Usage: python -m tests.iterator.resume_worker DATA CACHE STATE_IN|- OUT STEPS|-1
Writes {"batches": [[first tokens of each sample], ...], "state": ...} to OUT (atomically): after STEPS
batches (then sleeps until SIGKILLed), or at the end of the epoch when STEPS is -1.
"""

import json
import os
import sys
import time

from stager.config import FetchConfig
from stager.iterator import TokenIterator

SETTINGS = dict(seq_len=16, seed=5, shuffle_window=3, batch_size=4, batches=True, log_every=0)


def make(data: str, cache: str) -> TokenIterator:
    return TokenIterator(data, cache_dir=cache, capacity=1 << 30, fetch=FetchConfig(durable=False), **SETTINGS)


def write(path: str, payload: dict) -> None:
    with open(path + ".tmp", "w") as fh:
        json.dump(payload, fh)
    os.replace(path + ".tmp", path)


def main() -> None:
    data, cache, state_in, out, steps = sys.argv[1:6]
    steps = int(steps)
    it = make(data, cache)
    if state_in != "-":
        with open(state_in) as fh:
            it.load_state_dict(json.load(fh)["state"])
    batches = []
    for batch in it:
        batches.append(batch[:, 0].tolist())
        if len(batches) == steps:
            write(out, {"batches": batches, "state": it.state_dict()})
            time.sleep(120)  # the test kills us here, mid-epoch, with prefetches in flight
    write(out, {"batches": batches, "state": it.state_dict()})


if __name__ == "__main__":
    main()
