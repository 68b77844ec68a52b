"""A training process for the first-window resume test: a cold iterator over a slow S3 origin reads
batches, saves its state after N of them (mid-way through the striped first window), then waits to be killed.

Usage: python -m tests.iterator.stripe_worker SPEC_JSON STATE_IN|- OUT STEPS|-1
SPEC_JSON: {"url", "storage_options", "cache"}. Writes {"batches": [[first token of each row], ...],
"state": ..., "blocks_served": n} to OUT (atomically): after STEPS batches (then sleeps until SIGKILLed),
or at the end of the epoch when STEPS is -1.
"""

import json
import os
import sys
import time

from stager.config import FetchConfig, RetryConfig
from stager.iterator import TokenIterator

BLOCK = 16384  # the corpus's block size
SETTINGS = dict(seq_len=256, seed=3, shuffle_window=4, batch_size=16, batches=True, log_every=0)
FETCH = FetchConfig(concurrency=8, durable=False, request_bytes=4 * BLOCK, hedge=False,
                    retry=RetryConfig(attempts=12, backoff_base=0.005, backoff_max=0.05, deadline=60.0,
                                      request_timeout=15.0))


def make(url: str, storage_options: dict, cache: str, **overrides) -> TokenIterator:
    settings = dict(SETTINGS, **overrides)
    return TokenIterator(url, storage_options=storage_options, cache_dir=cache, capacity=1 << 30, fetch=FETCH,
                         **settings)


def write(path: str, payload: dict) -> None:
    with open(path + ".tmp", "w") as fh:
        json.dump(payload, fh)
    os.replace(path + ".tmp", path)


def main() -> None:
    spec, state_in, out, steps = sys.argv[1:5]
    spec = json.loads(spec)
    steps = int(steps)
    it = make(spec["url"], spec["storage_options"], spec["cache"])
    if state_in != "-":
        with open(state_in) as fh:
            it.load_state_dict(json.load(fh)["state"])
    batches = []
    for batch in it:
        batches.append(batch[:, 0].tolist())
        if len(batches) == steps:
            write(out, {"batches": batches, "state": it.state_dict(), "blocks_served": it.stats()["blocks_served"]})
            time.sleep(120)  # the test kills us here, mid-window, with block reads in flight
    write(out, {"batches": batches, "state": it.state_dict(), "blocks_served": it.stats()["blocks_served"]})


if __name__ == "__main__":
    main()
