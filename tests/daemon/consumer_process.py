"""A consumer process for the daemon tests: reads a plan's blobs through ``open_session`` and logs them.

For each position it waits until the blob is ready, reads the whole cache
file, and appends ``{"pos", "index", "digest", "mode"}`` to ``--out`` (one
JSON line, flushed), then advances. At the end it appends ``{"done": true,
"stats": ..., "kind": ...}``. The parent checks the stream against the manifest.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from stager.config import CacheConfig, FetchConfig, RetryConfig, SourceConfig
from stager.hashing import blob_digest
from stager.session import open_session


async def run(args: argparse.Namespace) -> None:
    order = [int(i) for i in args.order.split(",") if i]
    fetch = FetchConfig(concurrency=8, retry=RetryConfig(backoff_base=0.02, backoff_max=0.5, deadline=30))
    session = open_session(CacheConfig(directory=args.cache, capacity=args.capacity), fetch, socket=args.socket,
                           mode=args.mode, reconnect_timeout=args.reconnect_timeout)
    with open(args.out, "a", buffering=1) as out:
        async with session:
            dataset = await session.open_dataset(SourceConfig(args.source))
            plan = await session.plan(dataset, order, window_bytes=args.window, name="test-consumer")
            for position, index in enumerate(order):
                path = await plan.ready(position)
                data = await asyncio.get_running_loop().run_in_executor(None, path.read_bytes)
                mode = getattr(session, "mode", "embedded")
                out.write(json.dumps({"pos": position, "index": index, "digest": blob_digest(data),
                                      "mode": mode}) + "\n")
                await plan.advance(position + 1)
                if args.delay:
                    await asyncio.sleep(args.delay)
            await plan.close()
            out.write(json.dumps({"done": True, "stats": session.stats(), "kind": type(session).__name__}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--capacity", type=int, default=1 << 30)
    parser.add_argument("--source", required=True)
    parser.add_argument("--order", required=True)
    parser.add_argument("--mode", default="daemon")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--reconnect-timeout", type=float, default=30.0)
    parser.add_argument("--window", type=int, default=None)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
