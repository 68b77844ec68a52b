"""Span planning: which wanted blocks of a blob go in which ranged request, and at what priority.

Blocks are the unit of verification, spans the unit of requests: small blocks
let a reader have the block it waits for sooner, while whole-blob fetches
still go as requests of about ``FetchConfig.request_bytes``. A block a reader
waits for alone starts a span of its own, so its request is as short as can
be and its reader is served first. A span's gate priority is its most urgent
block's; a block wanted more urgently later moves its queued span up.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..aio import retrieve

if TYPE_CHECKING:
    from .gate import PriorityGate


def block_priority(blob_priority: float, index: int) -> float:
    """The gate priority of block ``index`` of a blob wanted whole at ``blob_priority``: nearer blocks first."""
    return blob_priority + index * 1e-6


class WantedBlock:
    """One block a job fetches: its gate priority and the future its waiters share.

    The future's result is None once the block is verified and recorded
    (readers then read it from the cache), or bytes if the job held them.
    """

    __slots__ = ("index", "priority", "future", "explicit", "span")

    def __init__(self, index: int, priority: float) -> None:
        self.index = index
        self.priority = priority
        self.future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        self.future.add_done_callback(retrieve)
        self.explicit = False  # someone waits for this very block: a whole-blob failure does not stop it
        self.span: Span | None = None  # the request it goes in, once there is one

    def boost(self, gate: "PriorityGate", priority: float) -> None:
        """Wanted at ``priority`` now: if that is sooner, move it (and its queued request) up."""
        if priority < self.priority:
            self.priority = priority
            if self.span is not None:
                self.span.boost(gate, priority)


class Span:
    """Consecutive blocks fetched by one ranged request, each verified and recorded as soon as it is in."""

    __slots__ = ("blocks", "priority")

    def __init__(self, blocks: list[WantedBlock]) -> None:
        self.blocks = blocks
        self.priority = min(block.priority for block in blocks)
        for block in blocks:
            block.span = self

    @property
    def indexes(self) -> list[int]:
        return [block.index for block in self.blocks]

    def boost(self, gate: "PriorityGate", priority: float) -> None:
        if priority < self.priority:
            self.priority = priority
            gate.boost(self, priority)


def plan_spans(blocks: list[WantedBlock], block_size: int, request_bytes: int) -> list[Span]:
    """``blocks`` (in index order) as requests: runs of consecutive blocks up to ``request_bytes``."""
    spans: list[Span] = []
    run: list[WantedBlock] = []
    for block in blocks:
        if run and (block.index != run[-1].index + 1 or block.explicit or run[-1].explicit
                    or (len(run) + 1) * block_size > request_bytes):
            spans.append(Span(run))
            run = []
        run.append(block)
    if run:
        spans.append(Span(run))
    return spans
