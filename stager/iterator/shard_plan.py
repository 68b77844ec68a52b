"""The shard planner: which shards one consumer's slice of an epoch touches, in order of first touch.

The plan a consumer registers with its session is that order, with the first
shuffle windows of the next epoch after it (so the epoch boundary is staged
while this epoch ends, never waited on). How far ahead of the cursor it is
staged is the engine's to measure (seconds of the consumer's rate, see
:mod:`stager.engine.read_ahead`) between two bounds the planner sets: a floor
of two shuffle windows, the current one and the next, which must be complete
before the cursor reaches them for the loop never to stall; and the prefetch
window, at least as large, as the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .deal import Slice
from .order import EpochOrder

PLAN_BLOCK = 1 << 20  # positions mapped per call while computing the plan


@dataclass(frozen=True, slots=True)
class AheadBounds:
    """How far ahead of its cursor a plan stages: ``floor_bytes`` whatever the consumer's pace (two
    shuffle windows), at most ``window_bytes`` (the prefetch window, never below the floor)."""

    floor_bytes: int
    window_bytes: int


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """The shards of a slice from a position on, in order of first touch, and the window of each;
    ``staged`` is what the session is asked to stage (those, then the next epoch's first windows)
    and ``ahead`` the bounds on how far ahead of the cursor."""

    shards: np.ndarray
    windows: np.ndarray
    staged: np.ndarray
    ahead: AheadBounds
    name: str


def first_touch(order: EpochOrder, piece: Slice, start: int, shard_count: int) -> tuple[np.ndarray, np.ndarray]:
    """Shards of ``piece`` from sample ``start`` on, in order of first touch, and their windows."""
    seen = np.zeros(shard_count, dtype=bool)
    shards, windows = [], []
    for lo in range(start, len(piece), PLAN_BLOCK):
        found = order.lookup(piece.positions(lo, lo + PLAN_BLOCK))
        fresh = ~seen[found.shards]
        s, w = found.shards[fresh], found.windows[fresh]
        _, first = np.unique(s, return_index=True)
        first.sort()
        shards.append(s[first])
        windows.append(w[first])
        seen[s] = True
    if not shards:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(shards), np.concatenate(windows)


def plan_shards(order: EpochOrder, following: EpochOrder, piece: Slice, start: int, sizes: np.ndarray,
                prefetch_bytes: int) -> ShardPlan:
    """The plan of ``piece`` from sample ``start`` on; ``following`` is the next epoch's order and
    ``prefetch_bytes`` the wished-for prefetch window (raised to the floor, two shuffle windows)."""
    shards, windows = first_touch(order, piece, start, len(sizes))
    floor = 2 * order.max_window_bytes(sizes)
    ahead = AheadBounds(floor, max(prefetch_bytes, floor))
    extra, budget = [], ahead.window_bytes
    for w in range(following.windows):
        if budget <= 0:
            break
        extra.append(following.window_shards(w))
        budget -= int(sizes[extra[-1]].sum())
    staged = np.concatenate([shards, *extra]) if extra else shards
    return ShardPlan(shards, windows, staged, ahead, f"epoch-{order.epoch}")
