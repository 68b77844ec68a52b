"""A session that runs the engine inside the consumer's own process."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..cache import CacheTier
from ..config import CacheConfig, FetchConfig, SourceConfig
from ..engine import URGENT, Dataset, Engine, Plan
from ..manifest import Manifest
from .base import DatasetHandle, PlanHandle, Session


class EmbeddedDataset(DatasetHandle):
    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.url = dataset.name
        self.manifest = dataset.manifest


class EmbeddedPlan(PlanHandle):
    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def __len__(self) -> int:
        return len(self.plan.order)

    async def ready(self, position: int, *, urgent: bool = True) -> Path:
        return await self.plan.ready(position, urgent=urgent)

    async def advance(self, position: int) -> None:
        self.plan.advance(position)

    def read_ahead(self) -> tuple[float | None, int] | None:
        return self.plan.rate, self.plan.ahead_bytes

    async def close(self) -> None:
        await self.plan.close()


class EmbeddedSession(Session):
    """Owns a cache tier and an engine in this process. Build with :meth:`open`."""

    def __init__(self, engine: Engine, owns_cache: bool = True) -> None:
        self.engine = engine
        self._owns_cache = owns_cache

    @classmethod
    def open(cls, cache: CacheConfig, fetch: FetchConfig = FetchConfig()) -> "EmbeddedSession":
        return cls(Engine(CacheTier(cache), fetch))

    async def open_dataset(self, source: SourceConfig, manifest: Manifest | None = None) -> EmbeddedDataset:
        return EmbeddedDataset(await self.engine.open_dataset(source, manifest))

    async def plan(self, dataset: DatasetHandle, order: Sequence[int] | np.ndarray | None = None, *,
                   window_bytes: int | None = None, name: str | None = None,
                   floor_bytes: int | None = None, ahead_seconds: float | None = None) -> EmbeddedPlan:
        assert isinstance(dataset, EmbeddedDataset)
        return EmbeddedPlan(self.engine.plan(dataset.dataset, order, window_bytes=window_bytes, name=name,
                                             floor_bytes=floor_bytes, ahead_seconds=ahead_seconds))

    async def read_block(self, dataset: DatasetHandle, index: int, block: int) -> bytes:
        """The verified bytes of one block; only that block is fetched (urgently) if the cache lacks it."""
        assert isinstance(dataset, EmbeddedDataset)
        return await self.engine.read_block(dataset.dataset.ref(index), block, priority=URGENT)

    def stats(self) -> dict[str, float]:
        return {**self.engine.stats.as_dict(), **{f"origin_{k}": v for k, v in self.engine.origin_stats.snapshot().items()}}

    async def close(self) -> None:
        await self.engine.close()
        if self._owns_cache:
            self.engine.cache.close()
