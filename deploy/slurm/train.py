"""A minimal training loop reading through TokenDataset: the example that train.sbatch runs.

Each rank (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK) reads its own slice of every epoch,
staged ahead of its cursor by the node's daemon (the job's prolog started it; the task
prolog set STAGER_SOCKET and STAGER_CACHE), or by an engine in the process when no daemon
serves the cache. The loader's state is saved with each checkpoint, so a job that is
requeued resumes the exact stream, at any world size.

    torchrun --nproc-per-node 8 train.py s3://bucket/corpus --steps 1000 --checkpoint ckpt.pt
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist

from stager.torch import StatefulDataLoader, TokenDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="the dataset's URL (a folder or s3://bucket/prefix with a manifest)")
    parser.add_argument("--cache", default=os.environ.get("STAGER_CACHE"), help="cache directory (STAGER_CACHE)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--vocab", type=int, default=65536)
    parser.add_argument("--checkpoint", type=Path, default=None, help="save here every --save-every steps")
    parser.add_argument("--save-every", type=int, default=50)
    args = parser.parse_args()

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if distributed else 0
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu")

    # Whole batches made in this process, a few ahead on a helper thread while the step computes:
    # the engine (or the daemon) stages on its own, so no loader workers are needed.
    ds = TokenDataset(args.source, cache_dir=args.cache, seq_len=args.seq_len, seed=0,
                      batch_size=args.batch_size, batches=True, with_labels=True, drop_last=True)
    loader = StatefulDataLoader(ds, batch_size=None)
    model = torch.nn.Sequential(torch.nn.Embedding(args.vocab, 64), torch.nn.Linear(64, args.vocab)).to(device)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    step = 0
    if args.checkpoint and args.checkpoint.exists():
        saved = torch.load(args.checkpoint, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])     # rank 0's state resumes every rank, re-dealt if need be
        step = saved["step"]
        if rank == 0:
            print(f"resumed at step {step} from {args.checkpoint}", flush=True)

    epoch = 0
    while step < args.steps:
        ds.set_epoch(epoch)
        for batch in loader:
            batch = batch.to(device) % args.vocab
            inputs, labels = batch[:, :-1], batch[:, 1:]
            logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), labels.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if rank == 0 and step % 10 == 0:
                print(f"step {step} loss {loss.item():.3f}", flush=True)
            if rank == 0 and args.checkpoint and step % args.save_every == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "loader": loader.state_dict(), "step": step}, args.checkpoint)
            if step >= args.steps:
                break
        epoch += 1
    if rank == 0:
        stats = ds.stats()
        print(f"done: {step} steps; waited {stats['wait_seconds']:.2f}s for data, "
              f"{stats['bytes_staged']} bytes staged, {stats['cache_hits']} shards already cached", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
