"""A training process for the elastic resume tests: one rank, a StatefulDataLoader, resumed the standard way.

Usage: python -m tests.torch.elastic_worker DATA CACHE OUT --workers K [--steps N] [--load STATE]
       [--via loader|dataset|both] [--loader torchdata|stager] [--snapshot-every N]
       [--world W --rank R --store FILE]

With ``--steps N`` it saves ``loader.state_dict()`` to ``OUT.state`` and the batches read so far to
``OUT`` after N steps, then waits to be killed. Without, it reads the rest of the epoch and writes it to
``OUT``. ``--load`` resumes through ``loader.load_state_dict`` (``--via loader``, the default),
``ds.load_state_dict`` before the loader is built (``dataset``), or both; ``--loader`` picks torchdata's
``StatefulDataLoader`` (the default) or ``stager.torch.StatefulDataLoader``. With ``--world`` it joins a
gloo group (a FileStore: no port to choose) and meets the other ranks at a barrier after the epoch, as a
training job's collectives would. An error prints one line and exits 3.
"""

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader as TorchdataLoader

from tests.torch.loader_worker import BATCH, make


def write(path: str, batches: list) -> None:
    with open(path + ".tmp", "w") as fh:
        json.dump(batches, fh)
    os.replace(path + ".tmp", path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("cache")
    p.add_argument("out")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--steps", type=int, default=-1)
    p.add_argument("--load")
    p.add_argument("--via", choices=("loader", "dataset", "both"), default="loader")
    p.add_argument("--loader", choices=("torchdata", "stager"), default="torchdata")
    p.add_argument("--snapshot-every", type=int, default=1)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--store")
    args = p.parse_args()
    if args.world > 1:
        store = dist.FileStore(args.store, args.world)
        dist.init_process_group("gloo", store=store, rank=args.rank, world_size=args.world,
                                timeout=datetime.timedelta(seconds=120))
    try:
        ds = make(args.data, args.cache)  # rank and world from torch.distributed
        state = torch.load(args.load, weights_only=False) if args.load else None
        if state is not None and args.via != "loader":
            ds.load_state_dict(state)
        if args.loader == "stager":
            from stager.torch import StatefulDataLoader
        else:
            StatefulDataLoader = TorchdataLoader
        loader = StatefulDataLoader(ds, batch_size=BATCH, num_workers=args.workers,
                                    snapshot_every_n_steps=args.snapshot_every)
        if state is not None and args.via != "dataset":
            loader.load_state_dict(state)
        batches = []
        for batch in loader:
            batches.append(batch[:, 0].tolist())
            if len(batches) == args.steps:
                torch.save(loader.state_dict(), args.out + ".state")
                write(args.out, batches)
                time.sleep(120)  # killed here by the test
    except Exception as exc:  # the job's own report: one line, then out without waiting for anyone
        print(f"error: {type(exc).__name__}: {str(exc).splitlines()[-1] if str(exc) else ''}", file=sys.stderr,
              flush=True)
        os._exit(3)
    write(args.out, batches)
    if args.world > 1:
        dist.barrier()  # a collective every rank must reach: a rank that failed alone would hang the others here
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
