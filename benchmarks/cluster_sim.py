"""A simulated cluster of 10 to 1,000 nodes spreading one shuffle window, driven by the real placement code.

What is real: who owns each blob, whom each node asks and whom it sends to
(``stager.cluster.placement``: rendezvous ranking of the live members, the
per-blob spreading tree, the staggered start of each node ``first_block_in``),
re-computed over the live members when nodes die.
What is modelled (a discrete-event simulation, no sockets), as the real
nodes behave: every node wants every blob of the window at once; a node that
does not own a blob asks its parent in requests of ``--request-mib`` (the
engine's spans), all at once, laid from its staggered start, the blocks
before that start asked last, once the rest are in (as the engine's job does;
a parent asked for a block it left for last asks for it at once, as its
engine's explicit want would); the owner asks the origin, block by block
across the window. At most ``--per-peer`` requests of one node to one peer
are open at once; the rest wait, taken as the client's turns take them (the
first request for each blob before the second for any, ties in the order
asked; ``first-copies``) or in the order asked (the client's connection pool
before). A parent answers each request in block order as it holds the
blocks, and its uplink (``--link`` bytes/s, plus a small latency per block)
is shared in rounds, all of a round's blocks ending together (TCP sharing one
link, at block grain): in each round, with ``first-copies``, each asker's
lane moves one block, of the request whose next block at hand has the
fewest copies outside the parent (those it sent, plus one unless it owns the
blob; ties by arrival; one passed over ``MAX_OVERTAKEN`` times goes next:
``stager.cluster.uplink``); before, each request with its next block at hand
moved one block. The origin is one FIFO link of
``--origin`` bytes/s shared by the whole cluster (plus its latency per
request). At the middle of the window (half of all deliveries done)
``--die`` of the nodes (at least one) die: whatever they were sending is
lost, and so are their requests to the origin that it had not started
sending. The survivors rank the live members again and ask for the rest of
every request that was cut, as the engine names a span's sources again: a
non-owner its new parent; a new owner the nodes ranked after it
(``SUCCESSORS``), each for the run it holds from the start of what is left
(``hold``), and the origin for the rest. (The holdings are read when the
owner asks, where a real owner asks the second successor after the first has
answered: if anything kind.)

Origin bytes above one window are then what died with the dead nodes: blocks
they had fetched and not yet sent to anyone. The script counts those too
(``lost``: blocks only a dead node held when it died, or that the origin was
sending it), and repeats each N over ``--seeds`` draws of digests and
victims (which node dies, and what it owned, decides most of it at small N).

``--policy`` names the code modelled, each on the same draws:
``first-copies`` (the code as it is: staggered children, first copies first
in each lane, every blob asked for at once), ``staggered`` (the code before:
staggered children, requests answered side by side and queued in the order
asked), ``in-order`` (the code before that: no staggering). The default
runs ``staggered`` and ``first-copies``. Not modelled: the time-based bound
of the real lanes (``MAX_WAIT``, 5 s: a window spreads in under 2 s), the
drain bound (``DRAIN_HOLD``: receivers here read at once) and urgency (no
consumer blocks here).

Prints, per policy and N: origin bytes / window bytes (mean and worst over
the seeds), the blocks only a dead node held (per window, mean), the most
blocks any node sent of one blob (in blobs), the time until every live node
holds the window, and that time divided by log2(N).

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
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stager.cluster.peer_source import SUCCESSORS  # noqa: E402
from stager.cluster.placement import DEFAULT_FANOUT, first_block_in, ranked, upstream_in  # noqa: E402
from stager.cluster.uplink import MAX_OVERTAKEN  # noqa: E402

POLICIES = ("in-order", "staggered", "first-copies")


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


class _Stream:
    """One request from ``receiver`` to ``sender`` for blocks of one blob, sent in order (``hold``: a fixed
    run the sender holds)."""

    __slots__ = ("sender", "receiver", "blob", "blocks", "inflight", "left", "seq", "ordinal", "overtaken")

    def __init__(self, sender: str, receiver: str, blob: int, blocks: list[int], seq: int, ordinal: int) -> None:
        self.sender, self.receiver, self.blob = sender, receiver, blob
        self.blocks = deque(blocks)
        self.inflight: set[int] = set()  # blocks sent, not yet arrived
        self.left = len(blocks)  # blocks not yet arrived
        self.seq = seq  # arrival order
        self.ordinal = ordinal  # requests of the receiver for this blob to this sender before it
        self.overtaken = 0  # turns of its lane others took while its next block was at hand

    def __lt__(self, other: "_Stream") -> bool:  # the client's queue: first requests of each blob first
        return (self.ordinal, self.seq) < (other.ordinal, other.seq)


@dataclass
class _Node:
    name: str
    alive: bool = True
    have: list[set[int]] = field(default_factory=list)  # per blob: blocks held
    pending: list[set[int]] = field(default_factory=list)  # per blob: blocks on their way here
    head: list[list[int]] = field(default_factory=list)  # per blob: staggered head, asked once the rest is in
    inbound: list[int] = field(default_factory=list)  # per blob: requests of this node still open
    sent: list[int] = field(default_factory=list)  # per blob: blocks sent
    copies: list[list[int]] = field(default_factory=list)  # per blob, per block: copies sent
    out: list[_Stream] = field(default_factory=list)  # requests this node answers
    busy: bool = False  # the uplink is sending a round


class Simulation:
    """The real nodes' pull model (see the module doc): ``first_copies`` as the code is (staggered too),
    ``staggered`` alone (the code before), or every node in block order (neither: the code before that)."""

    def __init__(self, n: int, *, blobs: int, blocks: int, block_bytes: int, span_blocks: int, link: float,
                 origin: float, peer_latency: float, origin_latency: float, die: float, fanout: int, seed: int,
                 per_peer: int = 8, staggered: bool = True, first_copies: bool = False) -> None:
        self.staggered = staggered
        self.first_copies = first_copies
        self.asking: dict[tuple[str, str, int], int] = {}  # (receiver, sender, blob): requests queued or open
        self.stream_seq = 0
        self.per_peer = per_peer
        self.open: dict[tuple[str, str], int] = {}  # (receiver, sender): requests being answered
        self.queued: dict[tuple[str, str], list[_Stream]] = {}  # (receiver, sender): waiting for a connection
        self.rng = random.Random(seed)
        self.blocks, self.block_bytes, self.span_blocks = blocks, block_bytes, min(span_blocks, blocks)
        self.link, self.origin, self.fanout = link, origin, fanout
        self.peer_latency, self.origin_latency = peer_latency, origin_latency
        self.digests = [f"{self.rng.getrandbits(128):032x}" for _ in range(blobs)]
        names = [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:7070" for i in range(n)]
        self.node = {name: _Node(name, have=[set() for _ in range(blobs)], pending=[set() for _ in range(blobs)],
                                 head=[[] for _ in range(blobs)], inbound=[0] * blobs, sent=[0] * blobs,
                                 copies=[[0] * blocks for _ in range(blobs)])
                     for name in names}
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

    # -- asking ------------------------------------------------------------------------------

    def _start(self, name: str, blob: int) -> None:
        """``name`` wants the whole blob: the owner from the origin, the others from their parent, in
        requests of ``span_blocks`` laid from the node's staggered start, the blocks before it last."""
        order = self.order[blob]
        first = first_block_in(order, name, self.fanout, self.span_blocks) if self.staggered else 0
        node = self.node[name]
        node.head[blob] = list(range(first))
        for at in range(first, self.blocks, self.span_blocks):
            self._ask(name, blob, list(range(at, min(at + self.span_blocks, self.blocks))))

    def _ask(self, name: str, blob: int, blocks: list[int], now: float = 0.0) -> None:
        """``name`` asks for ``blocks`` of ``blob`` as its engine would name the sources now."""
        node = self.node[name]
        blocks = [b for b in blocks if b not in node.have[blob] and b not in node.pending[blob]]
        if not blocks:
            return
        order = self.order[blob]
        chain = upstream_in(order, name, self.fanout)
        if chain:  # relay (or fetch) from the parent: it sends each block once it holds it
            self._open(now, chain[0], name, blob, blocks)
            return
        for successor in order[1:1 + SUCCESSORS]:  # the owner: what the nodes ranked after it hold, from the start
            held = self.node[successor].have[blob]
            run = 0
            while run < len(blocks) and blocks[run] in held:
                run += 1
            if run:
                self._open(now, successor, name, blob, blocks[:run])
                blocks = blocks[run:]
            if not blocks:
                return
        for block in blocks:  # then the origin
            node.pending[blob].add(block)
            start = max(now, self.origin_free)
            self.origin_free = start + self.block_bytes / self.origin
            self._push(start, "origin", (name, blob, block))  # counted when the origin starts sending

    def _open(self, now: float, sender: str, receiver: str, blob: int, blocks: list[int]) -> None:
        """A request, on one of the receiver's ``per_peer`` connections to the sender, or queued for one:
        in the order asked (the client's connection pool before), or with ``first_copies`` the first request
        for each blob before the second for any (the client's turns now)."""
        asking = (receiver, sender, blob)
        ordinal = self.asking.get(asking, 0)
        self.asking[asking] = ordinal + 1
        self.stream_seq += 1
        stream = _Stream(sender, receiver, blob, blocks, self.stream_seq, ordinal if self.first_copies else 0)
        self.node[receiver].inbound[blob] += 1
        key = (receiver, sender)
        if self.open.get(key, 0) >= self.per_peer:
            heapq.heappush(self.queued.setdefault(key, []), stream)
            return
        self.open[key] = self.open.get(key, 0) + 1
        self.node[sender].out.append(stream)
        self._wake(now, sender)

    def _stream_done(self, now: float, stream: _Stream) -> None:
        receiver, blob = stream.receiver, stream.blob
        key = (receiver, stream.sender)
        self._asked(stream)
        self.open[key] -= 1
        waiting = self.queued.get(key)
        if waiting:  # the connection takes the next request
            self.open[key] += 1
            self.node[stream.sender].out.append(heapq.heappop(waiting))
            self._wake(now, stream.sender)
        node = self.node[receiver]
        node.inbound[blob] -= 1
        if node.inbound[blob] == 0 and node.head[blob]:  # the rest is in: now the staggered head
            head, node.head[blob] = node.head[blob], []
            self._ask(receiver, blob, head, now=now)

    def _asked(self, stream: _Stream) -> None:
        asking = (stream.receiver, stream.sender, stream.blob)
        left = self.asking.get(asking, 0) - 1
        if left > 0:
            self.asking[asking] = left
        else:
            self.asking.pop(asking, None)

    # -- sending: each uplink shares itself among the requests it answers, block by block ----------

    def _wake(self, now: float, name: str) -> None:
        node = self.node[name]
        if node.busy or not node.alive:
            return
        batch = []
        keep = []
        for stream in node.out:
            to = self.node[stream.receiver]
            if not to.alive:
                continue
            keep.append(stream)
            if not stream.blocks:
                continue
            block = stream.blocks[0]
            if block in node.have[stream.blob]:
                batch.append(stream)
            elif block in node.head[stream.blob]:  # a peer waits for a block this node left for last:
                node.head[stream.blob].remove(block)  # it asks for that one now (the engine's explicit want)
                self._ask(name, stream.blob, [block], now=now)
        node.out = keep
        if not batch:
            return
        if self.first_copies:  # one block per asker's lane: the one sent fewest times (uplink.py)
            batch = self._first_copies(node, batch)
        node.busy = True
        sends = []
        for stream in batch:
            block = stream.blocks.popleft()
            stream.inflight.add(block)
            self.node[stream.receiver].pending[stream.blob].add(block)
            node.sent[stream.blob] += 1
            node.copies[stream.blob][block] += 1
            sends.append((stream, block))
        # every request in the round moves one block at an equal share of the link: all end together
        self._push(now + len(batch) * self.block_bytes / self.link, "round", (name, sends))

    def _first_copies(self, node: _Node, ready: list[_Stream]) -> list[_Stream]:
        """Of the requests with their next block at hand, one per receiver (its lane), as ``uplink.py``
        chooses: one overtaken ``MAX_OVERTAKEN`` times (oldest first), else the one whose next block has the
        fewest copies outside ``node`` (those it sent, plus one unless it owns the blob; ties by arrival);
        the others in the lane were overtaken once more."""
        lanes: dict[str, list[_Stream]] = {}
        for stream in ready:
            lanes.setdefault(stream.receiver, []).append(stream)
        chosen = []
        for waiting in lanes.values():
            overdue = [s for s in waiting if s.overtaken >= MAX_OVERTAKEN]
            if overdue:
                pick = min(overdue, key=lambda s: s.seq)
            else:
                pick = min(waiting, key=lambda s: (node.copies[s.blob][s.blocks[0]]
                                                   + (self.order[s.blob][0] != node.name), s.seq))
            for stream in waiting:
                stream.overtaken = 0 if stream is pick else stream.overtaken + 1
            chosen.append(pick)
        return chosen

    def _round(self, now: float, name: str, sends: list) -> None:
        node = self.node[name]
        node.busy = False
        if not node.alive:
            return
        for stream, block in sends:
            self._push(now + self.peer_latency, "arrive", (name, stream, block))
        self._wake(now, name)

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> Result:
        began = time.perf_counter()
        for blob in range(len(self.digests)):  # every node wants the window; the owners ask the origin
            for name in self.node:
                if self.order[blob][0] != name:
                    self._start(name, blob)
        for block in range(self.blocks):  # the owners' origin requests, block by block across the window
            for blob in range(len(self.digests)):
                self._ask(self.order[blob][0], blob, [block])
        steps = 0
        while self.events:
            now, _, kind, data = heapq.heappop(self.events)
            steps += 1
            if kind == "round":
                self._round(now, *data)
                continue
            if kind == "origin":  # the origin starts sending a block, unless its asker died meanwhile
                to, blob, block = data
                if self.node[to].alive:
                    self.origin_blocks += 1
                    self._push(now + self.block_bytes / self.origin + self.origin_latency, "arrive",
                               ("origin", None, (to, blob, block)))
                else:
                    self.node[to].pending[blob].discard(block)
                continue
            sender, stream, block = data
            if stream is None:
                to, blob, block = block
            else:
                to, blob = stream.receiver, stream.blob
            dst = self.node[to]
            if stream is not None:
                if not self.node[sender].alive:
                    continue  # lost with its sender (the survivors asked again when it died)
                stream.inflight.discard(block)
                stream.left -= 1
            dst.pending[blob].discard(block)
            if not dst.alive:
                if sender == "origin":
                    self.lost += 1  # the origin sent it to a node that died on the way
                continue
            if block not in dst.have[blob]:
                dst.have[blob].add(block)
                self.delivered += 1
                self.done_at = max(self.done_at, now)
            if stream is not None and not stream.left:
                self._stream_done(now, stream)
            self._wake(now, to)
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
        self.died = len(victims)
        survivors = [n for n in self.node.values() if n.alive]
        self.lost += sum(1 for v in victims for blob, held in enumerate(self.node[v].have) for block in held
                        if not any(block in s.have[blob] for s in survivors))
        self.needed -= sum(len(h) for v in victims for h in self.node[v].have)
        self._rank()  # the survivors' view once health checks found them gone
        for v in victims:  # what each survivor still wanted of a request to a dead node, asked again
            cut = list(self.node[v].out)
            for key in [k for k in self.queued if k[1] == v]:
                cut += self.queued.pop(key)
            for key in [k for k in self.open if k[1] == v]:
                del self.open[key]
            for key in [k for k in self.asking if k[1] == v]:
                del self.asking[key]
            for stream in cut:
                to = self.node[stream.receiver]
                if not to.alive:
                    continue
                for block in stream.inflight:  # the blocks in the dead node's round are lost
                    to.pending[stream.blob].discard(block)
                rest = sorted(stream.inflight) + list(stream.blocks)
                to.inbound[stream.blob] -= 1
                # the engine names the span's sources again: the new parent, or (a new owner) the nodes
                # ranked after it and then the origin
                self._ask(stream.receiver, stream.blob, rest, now=now)
                if to.inbound[stream.blob] == 0 and to.head[stream.blob]:
                    head, to.head[stream.blob] = to.head[stream.blob], []
                    self._ask(stream.receiver, stream.blob, head, now=now)
            self.node[v].out = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--blobs", type=int, default=16, help="blobs in the shuffle window")
    parser.add_argument("--blob-mib", type=int, default=64)
    parser.add_argument("--block-mib", type=int, default=1, help="the manifest's block (stager's default: 1 MiB)")
    parser.add_argument("--request-mib", type=int, default=8,
                        help="the most one request asks for (stager's request_bytes: 8 MiB)")
    parser.add_argument("--link", type=float, default=1.25e9, help="each node's uplink, bytes/s (10 Gb/s)")
    parser.add_argument("--origin", type=float, default=2.5e9, help="the origin's total egress, bytes/s")
    parser.add_argument("--peer-latency", type=float, default=0.0002)
    parser.add_argument("--origin-latency", type=float, default=0.02)
    parser.add_argument("--die", type=float, default=0.01, help="share of the nodes that die mid-window")
    parser.add_argument("--fanout", type=int, default=DEFAULT_FANOUT)
    parser.add_argument("--per-peer", type=int, default=8,
                        help="requests one node has open to one peer at once (stager's default: 8 connections to each peer)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--seeds", type=int, default=10, help="runs per N (digests and victims drawn anew)")
    parser.add_argument("--policy", choices=POLICIES, nargs="+", default=["staggered", "first-copies"],
                        help="first-copies: the code as it is (staggered children, each asker's lane sending the "
                             "block sent fewest times first, a node asking for every blob at once); staggered: the "
                             "code before (children staggered, requests queued in the order asked, the uplink "
                             "shared by requests); in-order: the code before that (no staggering); each one given "
                             "runs on the same draws")
    args = parser.parse_args()
    blocks = max(1, args.blob_mib // args.block_mib)
    span_blocks = max(1, args.request_mib // args.block_mib)
    window = args.blobs * blocks * args.block_mib << 20
    orders = args.policy
    print(f"window: {args.blobs} blobs of {args.blob_mib} MiB ({window / 2**30:.2f} GiB), {args.block_mib} MiB "
          f"blocks, requests of {span_blocks} blocks; links {args.link / 1e9:.2f} GB/s per node, origin "
          f"{args.origin / 1e9:.2f} GB/s in all; fanout {args.fanout}; {args.die:.0%} of the nodes die mid-window")
    print(f"one node alone from the origin: {window / min(args.link, args.origin):.2f} s")
    print(f"{args.seeds} seeds from {args.seed} per N; origin/window as mean and worst, lost as mean, "
          "the rest as mean (max sent/blob: worst)")
    print(f"{'policy':>12} {'nodes':>6} {'died':>5} {'origin/window':>14} {'worst':>7} {'lost':>7} "
          f"{'max sent/blob':>14} {'spread s':>9} {'s/log2(N)':>10} {'wall s':>7}")
    for n in args.nodes:
        for order in orders:
            runs = [Simulation(n, blobs=args.blobs, blocks=blocks, block_bytes=args.block_mib << 20,
                               span_blocks=span_blocks, link=args.link, origin=args.origin,
                               peer_latency=args.peer_latency, origin_latency=args.origin_latency, die=args.die,
                               fanout=args.fanout, seed=seed, per_peer=args.per_peer,
                               staggered=order != "in-order", first_copies=order == "first-copies").run()
                    for seed in range(args.seed, args.seed + args.seeds)]
            spread = statistics.mean(r.spread_seconds for r in runs)
            print(f"{order:>12} {n:>6} {runs[0].died:>5} {statistics.mean(r.origin_ratio for r in runs):>14.3f} "
                  f"{max(r.origin_ratio for r in runs):>7.3f} {statistics.mean(r.lost for r in runs):>7.3f} "
                  f"{max(r.max_sends_per_blob for r in runs):>14.2f} {spread:>9.2f} "
                  f"{spread / math.log2(n):>10.3f} {sum(r.wall for r in runs):>7.1f}", flush=True)
    print("command: " + " ".join(["benchmarks/cluster_sim.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
