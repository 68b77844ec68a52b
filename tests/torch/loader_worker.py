"""A training process for the StatefulDataLoader resume test (2 workers); checkpoints after N steps, then waits.

Usage: python -m tests.torch.loader_worker DATA CACHE STATE_IN|- OUT STEPS|-1
"""

import json
import os
import sys
import time

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from stager.config import FetchConfig
from stager.torch import TokenDataset

BATCH = 4


def make(data: str, cache: str, **kwargs) -> TokenDataset:
    settings = dict(seq_len=16, seed=9, shuffle_window=3, batch_size=BATCH, cache_dir=cache, capacity=1 << 30,
                    fetch=FetchConfig(durable=False), log_every=0)
    settings.update(kwargs)
    return TokenDataset(data, **settings)


def loader(ds: TokenDataset, workers: int = 2) -> StatefulDataLoader:
    return StatefulDataLoader(ds, batch_size=BATCH, num_workers=workers)


def main() -> None:
    data, cache, state_in, out, steps = sys.argv[1:6]
    steps = int(steps)
    dl = loader(make(data, cache))
    if state_in != "-":
        dl.load_state_dict(torch.load(state_in, weights_only=False))
    batches = []
    for batch in dl:
        batches.append(batch[:, 0].tolist())
        if len(batches) == steps:
            torch.save(dl.state_dict(), out + ".state")
            with open(out + ".tmp", "w") as fh:
                json.dump(batches, fh)
            os.replace(out + ".tmp", out)
            time.sleep(120)  # killed here by the test
    with open(out + ".tmp", "w") as fh:
        json.dump(batches, fh)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
