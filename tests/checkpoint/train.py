"""A training process for the checkpoint tests: N gloo ranks save one checkpoint through CheckpointWriter.

``python -m tests.checkpoint.train CONFIG.json``: the config names the world size, a free port, the
checkpoint's URL, replica, options and staging directory (or one per rank). Rank 0 prints ``SAVED <seconds>`` once every
rank's ``dcp.save`` returned, then every rank sleeps until killed (the tests SIGKILL them), at most
``linger`` seconds.
"""

from __future__ import annotations

import json
import sys
import time
import warnings


def rank_main(rank: int, config: dict) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from stager.checkpoint import CheckpointWriter
    from tests.checkpoint.model import state_dict

    warnings.simplefilter("ignore")
    world = config["world"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{config['port']}", rank=rank, world_size=world)
    staging = config["staging"]  # a list: one staging directory per rank, as if each were on its own node
    writer = CheckpointWriter(config["url"], staging_dir=staging[rank] if isinstance(staging, list) else staging,
                              replicas=[config["replica"]],
                              storage_options=config["options"],
                              replica_options={config["replica"]: config["replica_options"]},
                              drain=config.get("drain", "process"), thread_count=2)
    began = time.monotonic()
    dcp.save(state_dict(ranks=(rank,), world=world), storage_writer=writer)
    took = time.monotonic() - began
    dist.barrier()
    if rank == 0:
        print(f"SAVED {took:.3f}", flush=True)
    time.sleep(config.get("linger", 60))


def main() -> None:
    import torch.multiprocessing as mp

    with open(sys.argv[1]) as fh:
        config = json.load(fh)
    if config["world"] == 1:
        rank_main(0, config)
    else:
        mp.spawn(rank_main, args=(config,), nprocs=config["world"], join=True)


if __name__ == "__main__":
    main()
