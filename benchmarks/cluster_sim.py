"""A simulated cluster of 10 to 1,000 nodes spreading one shuffle window, driven by the real placement code.

What is real: who owns each blob, whom each node asks and whom it sends to
(``stager.cluster.placement``: rendezvous ranking of the live members, the
per-blob spreading tree), re-computed over the live members when nodes die.
What is modelled (a discrete-event simulation, no sockets): every node needs
every blob of the window; blocks move whole; each node's uplink is one FIFO
link of ``--link`` bytes/s (plus a small latency per block), the origin one
FIFO link of ``--origin`` bytes/s shared by the whole cluster (plus its
latency per request). A node forwards a block to its children in a blob's
tree as soon as it holds it (so a blob streams down the tree, pipelined). At
the middle of the window (half of all deliveries done) ``--die`` of the nodes
(at least one) die: whatever they were sending is lost, and so are their
requests to the origin that it had not started sending. The survivors rank
the live members again and ask for what they lack as the real nodes do
(``stager.cluster.peer_source``, and the engine naming a blob's sources
again after one fails): a node keeps the blocks it holds and asks its new
parent for the rest; a new owner asks the nodes ranked after it
(``SUCCESSORS``) for blocks they hold, and the origin only for blocks neither
holds. Blocks are modelled whole, where a real owner asks its successors for
a whole request (a run of blocks) at once, so the model is if anything kind.

Origin bytes above one window are then what died with the dead nodes: blocks
they had fetched and not yet sent to anyone. The script counts those too
(``lost``: blocks only a dead node held when it died, or that the origin was
sending it), and repeats each N
over ``--seeds`` draws of digests and victims (which node dies, and what it
owned, decides most of it at small N).

``--first-copies-first`` is a what-if, not the real code: each node's
uplink becomes a queue in which the first copy of a block goes out before
any later one, so that fewer blocks live on their owner alone when it dies.

Prints, per N: origin bytes / window bytes (mean and worst over the seeds),
the blocks only a dead node held (per window, mean), the most blocks any node
sent of one blob (in blobs), the time until every live node holds the window,
and that time divided by log2(N).

    .venv/bin/python benchmarks/cluster_sim.py --nodes 10 100 1000 --seeds 10
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stager.cluster.peer_source import SUCCESSORS  # noqa: E402
from stager.cluster.placement import DEFAULT_FANOUT, children_in, ranked, upstream_in  # noqa: E402


@dataclass
class Result:
    nodes: int
    died: int
    origin_ratio: float
    lost: float  # blocks only the dead nodes held when they died, or on their way to them from the origin
    max_sends_per_blob: float
    spread_seconds: float
    events: int
    wall: float


@dataclass
class _Node:
    name: str
    alive: bool = True
    uplink_free: float = 0.0
    have: list[set[int]] = field(default_factory=list)  # per blob: blocks held
    pending: list[set[int]] = field(default_factory=list)  # per blob: blocks on their way here
    sent: list[int] = field(default_factory=list)  # per blob: blocks sent to children
    queue: list[tuple] = field(default_factory=list)  # --first-copies-first: sends waiting for the uplink
    busy: bool = False  # --first-copies-first: the uplink is sending
    forwarded: set[tuple[int, int]] = field(default_factory=set)  # --first-copies-first: (blob, block) sent once


class Simulation:
    def __init__(self, n: int, *, blobs: int, blocks: int, block_bytes: int, link: float, origin: float,
                 peer_latency: float, origin_latency: float, die: float, fanout: int, seed: int,
                 first_copies_first: bool = False) -> None:
        self.first_copies_first = first_copies_first
        self.rng = random.Random(seed)
        self.blocks, self.block_bytes = blocks, block_bytes
        self.link, self.origin, self.fanout = link, origin, fanout
        self.peer_latency, self.origin_latency = peer_latency, origin_latency
        self.digests = [f"{self.rng.getrandbits(128):032x}" for _ in range(blobs)]
        self.nodes = {f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:7070": None for i in range(n)}
        self.node = {name: _Node(name, have=[set() for _ in range(blobs)], pending=[set() for _ in range(blobs)],
                                 sent=[0] * blobs) for name in self.nodes}
        self.to_kill = max(1, round(n * die)) if die > 0 and n > 1 else 0
        self.events: list[tuple[float, int, str, tuple]] = []
        self.seq = 0
        self.origin_free = 0.0
        self.origin_blocks = 0
        self.delivered = 0
        self.needed = n * blobs * blocks
        self.died = 0
        self.lost = 0
        self.done_at = 0.0
        self._rank()

    def _rank(self) -> None:
        live = [name for name, node in self.node.items() if node.alive]
        self.order = [ranked(d, live) for d in self.digests]  # the real rendezvous ranking, per blob

    def _push(self, at: float, kind: str, data: tuple) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, data))

    def _from_origin(self, now: float, owner: str, blob: int, block: int) -> None:
        node = self.node[owner]
        if block in node.have[blob] or block in node.pending[blob]:
            return
        node.pending[blob].add(block)
        start = max(now, self.origin_free)
        self.origin_free = start + self.block_bytes / self.origin
        self._push(start, "origin", ("origin", owner, blob, block))  # counted when the origin starts sending

    def _send(self, now: float, sender: str, to: str, blob: int, block: int) -> None:
        src, dst = self.node[sender], self.node[to]
        if not dst.alive or block in dst.have[blob] or block in dst.pending[blob]:
            return
        dst.pending[blob].add(block)
        if self.first_copies_first:  # a what-if, not the real code: each block's first copy jumps the queue
            first = (blob, block) not in src.forwarded
            src.forwarded.add((blob, block))
            self.seq += 1
            heapq.heappush(src.queue, (0 if first else 1, self.seq, to, blob, block))
            if not src.busy:
                self._next_send(now, sender)
            return
        src.sent[blob] += 1
        start = max(now, src.uplink_free)
        src.uplink_free = start + self.block_bytes / self.link
        self._push(src.uplink_free + self.peer_latency, "arrive", (sender, to, blob, block))

    def _next_send(self, now: float, sender: str) -> None:
        """--first-copies-first: the sender's uplink starts its next send (first copies before the rest)."""
        src = self.node[sender]
        src.busy = False
        while src.queue:
            _, _, to, blob, block = heapq.heappop(src.queue)
            if self.node[to].alive and block not in self.node[to].have[blob]:
                src.busy = True
                src.sent[blob] += 1
                self._push(now + self.block_bytes / self.link, "sent", (sender, to, blob, block))
                return

    def _ask(self, now: float, name: str, blob: int) -> None:
        """``name`` asks for what it lacks of ``blob``: its parent; or, if it owns the blob, the members ranked
        after it (what they hold) and then the origin."""
        node = self.node[name]
        chain = upstream_in(self.order[blob], name, self.fanout)
        successors = [] if chain else self.order[blob][1:1 + SUCCESSORS]
        for block in range(self.blocks):
            if block in node.have[blob] or block in node.pending[blob]:
                continue
            if not chain:
                holder = next((s for s in successors if block in self.node[s].have[blob]), None)
                if holder is not None:
                    self._send(now, holder, name, blob, block)
                else:
                    self._from_origin(now, name, blob, block)
            elif block in self.node[chain[0]].have[blob]:
                self._send(now, chain[0], name, blob, block)
            # else: the parent forwards it when it arrives there

    def run(self) -> Result:
        began = time.perf_counter()
        for block in range(self.blocks):  # the owners start, block by block across the window
            for blob in range(len(self.digests)):
                self._from_origin(0.0, self.order[blob][0], blob, block)
        steps = 0
        while self.events:
            now, _, kind, data = heapq.heappop(self.events)
            steps += 1
            sender, to, blob, block = data
            dst = self.node[to]
            if kind == "sent":  # --first-copies-first: a send left the uplink; the next one starts
                self._push(now + self.peer_latency, "arrive", data)
                if self.node[sender].alive:
                    self._next_send(now, sender)
                continue
            if kind == "origin":  # the origin starts sending a block, unless its asker died meanwhile
                if dst.alive:
                    self.origin_blocks += 1
                    self._push(now + self.block_bytes / self.origin + self.origin_latency, "arrive", data)
                else:
                    dst.pending[blob].discard(block)
                continue
            dst.pending[blob].discard(block)
            if not dst.alive and sender == "origin":
                self.lost += 1  # the origin sent it to a node that died on the way
            if not dst.alive or (sender != "origin" and not self.node[sender].alive) or block in dst.have[blob]:
                if dst.alive and block not in dst.have[blob]:
                    self._ask(now, to, blob)  # lost with its sender
                continue
            dst.have[blob].add(block)
            self.delivered += 1
            self.done_at = max(self.done_at, now)
            for child in children_in(self.order[blob], to, self.fanout):
                self._send(now, to, child, blob, block)
            if self.to_kill and self.delivered >= self.needed // 2:
                self._kill(now)
        live = [n for n in self.node.values() if n.alive]
        assert all(len(h) == self.blocks for n in live for h in n.have), "a live node lacks blocks"
        total_blocks = len(self.digests) * self.blocks
        return Result(len(self.node), self.died, self.origin_blocks / total_blocks, self.lost / total_blocks,
                      max(max(n.sent) for n in self.node.values()) / self.blocks, self.done_at, steps,
                      time.perf_counter() - began)

    def _kill(self, now: float) -> None:
        victims = self.rng.sample(sorted(self.node), self.to_kill)
        self.to_kill = 0
        for name in victims:
            self.node[name].alive = False
            for _, _, to, blob, block in self.node[name].queue:  # --first-copies-first: never sent
                self.node[to].pending[blob].discard(block)
            self.node[name].queue.clear()
        self.died = len(victims)
        survivors = [n for n in self.node.values() if n.alive]
        self.lost += sum(1 for v in victims for blob, held in enumerate(self.node[v].have) for block in held
                        if not any(block in s.have[blob] for s in survivors))
        self.needed -= sum(len(h) for v in victims for h in self.node[v].have)
        self._rank()  # the survivors' view once health checks found them gone
        for name, node in self.node.items():
            if node.alive:
                for blob in range(len(self.digests)):
                    self._ask(now, name, blob)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--blobs", type=int, default=16, help="blobs in the shuffle window")
    parser.add_argument("--blob-mib", type=int, default=64)
    parser.add_argument("--block-mib", type=int, default=8)
    parser.add_argument("--link", type=float, default=1.25e9, help="each node's uplink, bytes/s (10 Gb/s)")
    parser.add_argument("--origin", type=float, default=2.5e9, help="the origin's total egress, bytes/s")
    parser.add_argument("--peer-latency", type=float, default=0.0002)
    parser.add_argument("--origin-latency", type=float, default=0.02)
    parser.add_argument("--die", type=float, default=0.01, help="share of the nodes that die mid-window")
    parser.add_argument("--fanout", type=int, default=DEFAULT_FANOUT)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--seeds", type=int, default=10, help="runs per N (digests and victims drawn anew)")
    parser.add_argument("--first-copies-first", action="store_true",
                        help="a what-if, NOT the real code: each node's uplink sends the first copy of each block "
                             "before any later copy, so that fewer blocks live on their owner alone")
    args = parser.parse_args()
    blocks = max(1, args.blob_mib // args.block_mib)
    window = args.blobs * blocks * args.block_mib << 20
    print(f"window: {args.blobs} blobs of {args.blob_mib} MiB ({window / 2**30:.2f} GiB), {args.block_mib} MiB "
          f"blocks; links {args.link / 1e9:.2f} GB/s per node, origin {args.origin / 1e9:.2f} GB/s in all; "
          f"fanout {args.fanout}; {args.die:.0%} of the nodes die mid-window"
          + ("; WHAT-IF: first copies first (not the real code)" if args.first_copies_first else ""))
    print(f"one node alone from the origin: {window / min(args.link, args.origin):.2f} s")
    print(f"{args.seeds} seeds from {args.seed} per N; origin/window as mean and worst, lost as mean, "
          "the rest as mean (max sent/blob: worst)")
    print(f"{'nodes':>6} {'died':>5} {'origin/window':>14} {'worst':>7} {'lost':>7} {'max sent/blob':>14} "
          f"{'spread s':>9} {'s/log2(N)':>10} {'wall s':>7}")
    for n in args.nodes:
        runs = [Simulation(n, blobs=args.blobs, blocks=blocks, block_bytes=args.block_mib << 20, link=args.link,
                           origin=args.origin, peer_latency=args.peer_latency, origin_latency=args.origin_latency,
                           die=args.die, fanout=args.fanout, seed=seed,
                           first_copies_first=args.first_copies_first).run()
                for seed in range(args.seed, args.seed + args.seeds)]
        spread = statistics.mean(r.spread_seconds for r in runs)
        print(f"{n:>6} {runs[0].died:>5} {statistics.mean(r.origin_ratio for r in runs):>14.3f} "
              f"{max(r.origin_ratio for r in runs):>7.3f} {statistics.mean(r.lost for r in runs):>7.3f} "
              f"{max(r.max_sends_per_blob for r in runs):>14.2f} {spread:>9.2f} {spread / math.log2(n):>10.3f} "
              f"{sum(r.wall for r in runs):>7.1f}")
    print("command: " + " ".join(["benchmarks/cluster_sim.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
