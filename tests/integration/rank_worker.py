"""One rank of a training job (torch.distributed, gloo) reading a TokenDataset through a faulty origin.

Usage: python -m tests.integration.rank_worker CONFIG.json RANK

CONFIG holds: url, storage_options, cache, world_size, rendezvous (a file for
gloo's file:// rendezvous), state_in (the ``out`` of an earlier job, or null:
start of the epoch), state_rank (whose state to load: the rank's own when null),
steps (batches to take, -1: to the end of the epoch) and out (a prefix: writes
OUT.RANK.json with the first token of every sample, OUT.RANK.state with the
dataset's state).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from stager.config import FetchConfig, RetryConfig
from stager.torch import TokenDataset

SEQ_LEN = 256
BATCH = 8
# A generous retry budget: a third of the bodies are bad, and a block must never fail.
FETCH = FetchConfig(concurrency=8, durable=False,
                    retry=RetryConfig(attempts=30, backoff_base=0.005, backoff_max=0.05, deadline=120,
                                      request_timeout=20))


def main() -> None:
    config = json.loads(open(sys.argv[1]).read())
    rank = int(sys.argv[2])
    dist.init_process_group("gloo", init_method=f"file://{config['rendezvous']}", rank=rank,
                            world_size=config["world_size"], timeout=timedelta(seconds=120))
    try:
        ds = TokenDataset(config["url"], storage_options=config["storage_options"], seq_len=SEQ_LEN, seed=3,
                          shuffle_window=2, cache_dir=config["cache"], capacity=1 << 30, fetch=FETCH,
                          log_every=0, session="embedded")
        assert (ds.rank, ds.world_size) == (rank, config["world_size"])
        if config["state_in"]:
            whose = config["state_rank"] if config["state_rank"] is not None else rank
            ds.load_state_dict(torch.load(f"{config['state_in']}.{whose}.state", weights_only=False))
        firsts: list[list[int]] = []
        for batch in DataLoader(ds, batch_size=BATCH):
            rows = batch.numpy()
            for row in rows:  # every sample must be the origin's tokens: a run counting up from its first
                first = int(row[0])
                if not np.array_equal(row, np.arange(first, first + SEQ_LEN)):
                    raise AssertionError(f"rank {rank}: wrong tokens in the sample starting at {first}")
            firsts.append([int(r[0]) for r in rows])
            if len(firsts) == config["steps"]:
                break
        out = config["out"]
        torch.save(ds.state_dict(), f"{out}.{rank}.state")
        with open(f"{out}.{rank}.json.tmp", "w") as fh:
            json.dump(firsts, fh)
        os.replace(f"{out}.{rank}.json.tmp", f"{out}.{rank}.json")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
