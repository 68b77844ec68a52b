"""``IteratorConfig``: everything one token stream is built from, checked once, frozen.

:class:`~stager.iterator.iterator.TokenIterator` takes one (or the same
fields as keyword arguments, turned into one by :meth:`IteratorConfig.of`),
and so does every copy of it that a DataLoader worker makes: the values are
validated here, at the edge, and the parts below get the pieces they use
(the sample spec, the order spec, the dealing layout, the cache and fetch
settings) already built.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..config import CacheConfig, FetchConfig, SourceConfig, default_cache_dir
from ..errors import ConfigError
from .deal import Layout
from .order import OrderSpec
from .samples import SampleSpec

SESSION_MODES = ("auto", "daemon", "embedded")


def _count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")


@dataclass(frozen=True, slots=True)
class IteratorConfig:
    """One consumer's token stream, as asked for.

    Attributes:
        source: the dataset's URL and storage options.
        seq_len: tokens per sample (``seq_len + 1`` with ``with_labels``: inputs and labels shifted by one).
        seed: the shuffle seed; epochs are permuted by ``(seed, epoch)``.
        epoch: the epoch to start with.
        shuffle: False reads shards and samples in manifest order.
        shuffle_window: shards whose samples are mixed together; they are staged together.
        batch_size: samples per step on one rank: the unit dealt to ranks and workers (set it to the
            DataLoader's batch size so any step boundary is a resumable point at any world size).
        batches: yield ``(batch_size, sample_len)`` arrays instead of single samples.
        drop_last: deal only whole steps of ``world_size * batch_size`` samples per epoch.
        rank, world_size: this process among the data-parallel ranks.
        worker, num_workers: this consumer among the rank's loader workers.
        cache_dir, capacity: the node-local cache (directory; bytes, default 80% of its disk). It must
            hold two shuffle windows of the largest shards, or the iterator refuses it.
        fetch: how the engine fetches (concurrency, bandwidth, retries, ...).
        dtype: NumPy dtype of the yielded tokens (default: the shards' own, without a copy).
        token_column: the token column of Parquet / Arrow shards whose manifest names none.
        prefetch_bytes: the most staged ahead of the cursor (default: the fetch window, at
            least two shuffle windows; the engine caps it at half the cache).
        ahead_seconds: seconds of this consumer's measured reading staged ahead of the cursor past
            the current and next shuffle windows (which are always staged), up to ``prefetch_bytes``
            (default: ``fetch.ahead_seconds``, else the engine's or the node daemon's, 60 s; see
            :mod:`stager.engine.read_ahead`).
        log_every: seconds between progress log lines (0: never).
        make_ahead: with ``batches``, batches a helper thread makes while the loop computes, so
            that ``next()`` only takes one (0: each is made inside ``next()``). The loop never
            waits for the helper: when none is ready, ``next()`` makes it, in the same order.
        session: "auto" (the node daemon when one serves ``cache_dir``, else an engine in this
            process), "daemon" or "embedded".
        socket: the daemon's Unix socket (default: ``STAGER_SOCKET`` or the daemon's default).
        verify_reads: "first" hashes each shard's cache file the first time this process maps
            it, before any sample is cut from it (a file that changed on disk is dropped and
            fetched again); "off" trusts the cache disk. See :mod:`stager.cache.reader`.

    Raises:
        ConfigError: a bad value.
    """

    source: SourceConfig
    seq_len: int
    seed: int = 0
    epoch: int = 0
    with_labels: bool = False
    shuffle: bool = True
    shuffle_window: int = 8
    batch_size: int = 1
    batches: bool = False
    drop_last: bool = False
    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1
    cache_dir: str | os.PathLike[str] | None = None
    capacity: int | None = None
    fetch: FetchConfig = field(default_factory=FetchConfig)
    dtype: Any = None
    token_column: str = "tokens"
    prefetch_bytes: int | None = None
    ahead_seconds: float | None = None
    log_every: float = 60.0
    make_ahead: int = 4
    session: str = "auto"
    socket: str | os.PathLike[str] | None = None
    verify_reads: str = "first"
    # Built from the fields above, once.
    cache: CacheConfig = field(init=False, repr=False, compare=False)
    sample_spec: SampleSpec = field(init=False, repr=False, compare=False)
    order_spec: OrderSpec = field(init=False, repr=False, compare=False)
    layout: Layout = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Written through the page cache: this process reads each blob moments after staging it, from
        # memory then, and its maps read a file the writes brought in faster than one brought in by
        # their own faults. (The CLI, the daemon and the mount write past the page cache.)
        directory = Path(self.cache_dir) if self.cache_dir else default_cache_dir()
        set_ = object.__setattr__
        set_(self, "cache", CacheConfig(directory=directory, capacity=self.capacity, direct_writes=False,
                                        verify_reads=self.verify_reads))
        set_(self, "fetch", self.fetch or FetchConfig())
        if self.ahead_seconds is not None:  # checked by FetchConfig, which carries it to the engine
            set_(self, "fetch", replace(self.fetch, ahead_seconds=self.ahead_seconds))
            set_(self, "ahead_seconds", self.fetch.ahead_seconds)
        set_(self, "sample_spec", SampleSpec(self.seq_len, self.with_labels))
        set_(self, "order_spec", OrderSpec(self.seed, self.shuffle, self.shuffle_window))
        set_(self, "layout", Layout(self.world_size, self.rank, self.num_workers, self.worker, self.batch_size))
        _count("epoch", self.epoch)
        set_(self, "batches", bool(self.batches))
        set_(self, "drop_last", bool(self.drop_last))
        set_(self, "dtype", None if self.dtype is None else np.dtype(self.dtype))
        if self.prefetch_bytes is not None and self.prefetch_bytes <= 0:
            raise ConfigError(f"prefetch_bytes must be > 0, got {self.prefetch_bytes}")
        set_(self, "log_every", float(self.log_every))
        _count("make_ahead", self.make_ahead)
        if self.session not in SESSION_MODES:
            raise ConfigError(f"session must be auto, daemon or embedded, got {self.session!r}")

    @classmethod
    def of(cls, source: str | SourceConfig, *, storage_options: Mapping[str, Any] | None = None,
           **fields: Any) -> "IteratorConfig":
        """The config for ``source`` (a URL or path, with ``storage_options``; or a :class:`SourceConfig`)
        and the other fields by name.

        Raises:
            ConfigError: a bad value, or storage options given twice.
            TypeError: an unknown field.
        """
        if isinstance(source, SourceConfig):
            if storage_options:
                raise ConfigError("give storage_options in the SourceConfig or as an argument, not both")
        else:
            source = SourceConfig(str(source), dict(storage_options or {}))
        return cls(source, **fields)
