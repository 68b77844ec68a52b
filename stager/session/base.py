"""The seam between consumers and whoever runs the engine.

A consumer (the token iterator, the FUSE mount, ``stager stage``) talks to a
:class:`Session`: open a dataset, register a plan of its future reads, wait
until the blob at a position is verified in the cache, say how far it got.
Two implementations: :class:`~stager.session.embedded.EmbeddedSession` runs an
engine in the consumer's own process; the daemon's client runs none and asks
the node daemon over its Unix socket. Either way, data never crosses the
seam: the consumer reads verified files from the shared cache directory.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Sequence

import numpy as np

from ..config import SourceConfig
from ..manifest import Manifest


class DatasetHandle(abc.ABC):
    """A dataset opened through a session; its manifest is local and validated."""

    url: str
    manifest: Manifest


class PlanHandle(abc.ABC):
    """One consumer's future reads (positions index the plan's order)."""

    @abc.abstractmethod
    async def ready(self, position: int, *, urgent: bool = True) -> Path:
        """The complete, verified cache file of the blob at ``position``; fetched urgently if missing
        (not ``urgent``: at its place in the plan's order, by a caller that waits for the plan to get
        there rather than being blocked on it).

        Raises:
            OriginError: it could not be fetched within the retry budget (names the shard).
            CacheError: the cache cannot hold it.
        """

    @abc.abstractmethod
    async def advance(self, position: int) -> None:
        """The consumer is done with every position before ``position``."""

    def read_ahead(self) -> tuple[float | None, int] | None:
        """The consumer's measured rate (bytes/s; None before its cursor has moved) and how many bytes
        ahead of the cursor the plan stages now, when this process runs the plan; None when the node
        daemon does (``stager status`` and /metrics show them there)."""
        return None

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop prefetching for this plan."""


class Session(abc.ABC):
    """Access to staging for one consumer process."""

    @abc.abstractmethod
    async def open_dataset(self, source: SourceConfig, manifest: Manifest | None = None) -> DatasetHandle:
        """Open a dataset (loads and validates its manifest unless one is given)."""

    @abc.abstractmethod
    async def plan(self, dataset: DatasetHandle, order: Sequence[int] | np.ndarray | None = None, *,
                   window_bytes: int | None = None, name: str | None = None,
                   floor_bytes: int | None = None, ahead_seconds: float | None = None) -> PlanHandle:
        """Register the order in which this consumer will read the dataset's shards (default: manifest order).

        ``window_bytes`` is the most staged ahead of the consumer's cursor, ``floor_bytes`` what is
        staged ahead whatever its pace, and ``ahead_seconds`` how many seconds of its measured rate are
        staged past the floor (see :mod:`stager.engine.read_ahead`). No floor: the whole window is staged,
        as for a consumer that never advances; no window or seconds: the engine's (or daemon's) own.
        """

    @abc.abstractmethod
    async def read_block(self, dataset: DatasetHandle, index: int, block: int) -> bytes:
        """The verified bytes of one block of shard ``index`` (fetched urgently, alone, if missing)."""

    @abc.abstractmethod
    def stats(self) -> dict[str, float]:
        """Counters for this consumer: wait time, bytes staged, cache hits, retries."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release everything; prefetching for this consumer stops."""

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
