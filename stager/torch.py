"""``TokenDataset``: the token iterator as a PyTorch ``IterableDataset``.

The dataset object made in the training process holds the stream's settings
and its manifest (loaded once, so every worker uses the same); the stream
itself is a :class:`~stager.iterator.TokenIterator` made lazily in the
process that iterates (each DataLoader worker makes its own, with its own
staging session; nothing with a thread or a socket is pickled or inherited).

Ranks come from ``torch.distributed`` when it is initialised (or are given);
workers from ``torch.utils.data.get_worker_info()``. Pass the DataLoader's
``batch_size`` to the dataset too: chunks of that many samples are dealt to
ranks and workers in the order the loader consumes them, which makes every
step boundary a resumable point at any world size.

Resuming:

* same world size and workers: ``StatefulDataLoader.load_state_dict`` (each
  worker continues where it stopped; the stream is the same as without the
  interruption), or ``num_workers=0`` with ``ds.state_dict()``;
* another world size, worker count or batch size: load the loader's whole
  state into the dataset, ``ds.load_state_dict(loader.state_dict())``, then
  build a new loader; the rest of the epoch is re-dealt, each sample read
  once across all ranks.

With ``num_workers > 0`` and non-persistent workers, call
``ds.set_epoch(epoch)`` before each epoch (like ``DistributedSampler``): the
workers' copies cannot move the dataset in the training process forward.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Mapping

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from .errors import ConfigError
from .iterator import TokenIterator
from .iterator.state import StreamState, from_loader_state

_NUMPY_OF = {torch.int64: np.int64, torch.int32: np.int32, torch.uint16: np.uint16, torch.uint8: np.uint8,
             torch.int16: np.int16}


def _distributed() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class TokenDataset(IterableDataset):
    """Fixed-length token sequences from a staged dataset, as ``torch`` tensors.

    Takes the arguments of :class:`~stager.iterator.TokenIterator` (``seq_len``,
    ``seed``, ``batch_size``, ``cache_dir``, ...), except the worker ones, and:

    Args:
        dtype: the tensors' dtype (default ``torch.int64``, what embeddings take).
        rank, world_size: default from ``torch.distributed`` (else 0 of 1).
        batches: yield ``(batch_size, sample_len)`` tensors; use ``DataLoader(ds, batch_size=None)``.

    Raises:
        ConfigError: a bad argument, or a dtype that has no NumPy counterpart.
    """

    def __init__(self, source: Any, *, seq_len: int, dtype: torch.dtype = torch.int64, rank: int | None = None,
                 world_size: int | None = None, **kwargs: Any) -> None:
        super().__init__()
        for name in ("worker", "num_workers"):
            if name in kwargs:
                raise ConfigError(f"TokenDataset takes its {name} from the DataLoader, not as an argument")
        if dtype not in _NUMPY_OF:
            raise ConfigError(f"dtype {dtype} is not supported (choose from {sorted(map(str, _NUMPY_OF))})")
        auto_rank, auto_world = _distributed()
        self.rank = auto_rank if rank is None else rank
        self.world_size = auto_world if world_size is None else world_size
        self.torch_dtype = dtype
        kwargs.update(seq_len=seq_len, dtype=_NUMPY_OF[dtype], rank=self.rank, world_size=self.world_size)
        # The template checks every argument and loads the manifest once, here; workers reuse both.
        self._template = TokenIterator(source, **kwargs)
        self._kwargs = {k: v for k, v in kwargs.items() if k not in ("storage_options", "epoch")}
        self._kwargs.update(source=self._template.source, manifest=self._template.manifest)
        self._epoch = self._template.epoch
        self._pending: StreamState | None = None
        self._iterator: TokenIterator | None = None
        self._pid = os.getpid()

    @property
    def manifest(self):
        return self._template.manifest

    @property
    def epoch(self) -> int:
        it = self._local()
        return it.epoch if it is not None else self._epoch

    def _local(self) -> TokenIterator | None:
        """The iterator this process made, if any (a forked child's inherited one does not count)."""
        return self._iterator if self._pid == os.getpid() else None

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of ``epoch`` (a no-op when already in it: progress is kept)."""
        it = self._local()
        if it is not None:
            it.set_epoch(epoch)
        elif epoch != self._epoch:
            self._template.set_epoch(epoch)  # validates
            self._pending = None
        self._epoch = epoch

    def __len__(self) -> int:
        """Samples (or batches) per epoch for one consumer when the loader has no workers."""
        return len(self._template)

    def _bind(self) -> TokenIterator:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        it = self._local()
        if it is not None and (it.layout.workers, it.layout.worker) == (workers, worker) and self._pending is None:
            return it
        if it is not None:
            it.close()
        it = TokenIterator(**self._kwargs, worker=worker, num_workers=workers, epoch=self._epoch)
        if self._pending is not None:
            it.load_state(self._pending)
            self._pending = None
        self._iterator, self._pid = it, os.getpid()
        return it

    def __iter__(self) -> Iterator[torch.Tensor]:
        it = self._bind()
        if it.batches:
            it.wrap_batch = torch.from_numpy  # made with the batch, off the loop's path when made ahead
            yield from it
            return
        for sample in it:
            yield torch.from_numpy(sample)

    def state_dict(self) -> dict[str, Any]:
        """This process's stream state (in a worker: that worker's; see the module docstring)."""
        if self._local() is not None or get_worker_info() is not None:
            return self._bind().state_dict()
        if self._pending is not None:
            return self._pending.to_dict()
        self._template.set_epoch(self._epoch)
        return self._template.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state of this dataset, or from a whole ``StatefulDataLoader.state_dict()``.

        Raises:
            ConfigError: another dataset, seq_len or order; or a re-deal without every worker's progress.
        """
        parsed = from_loader_state(state)
        if parsed is None:
            return  # a loader state taken before any worker reported: nothing was read
        t = self._template
        parsed.check(t.index.fingerprint, t.order_spec.seed, t.order_spec.shuffle, t.order_spec.shuffle_window)
        self._pending, self._epoch = parsed, parsed.epoch
        it = self._local()
        if it is not None:
            it.close()
            self._iterator = None

    def stats(self) -> dict[str, Any]:
        """Wait time, bytes staged, cache hits, retries, steps ready ahead (of this process's stream)."""
        it = self._local()
        return it.stats() if it is not None else self._template.stats()

    def close(self) -> None:
        it = self._local()
        if it is not None:
            it.close()
        self._iterator = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_iterator"] = None  # each process makes its own stream and staging session
        return state
