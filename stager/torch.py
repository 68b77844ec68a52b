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

Resuming from a saved ``StatefulDataLoader.state_dict()``:

* the same world size and workers: ``loader.load_state_dict(state)``; each
  worker continues where it stopped, and the stream is the same as without
  the interruption;
* another world size, batch size or worker count (``num_workers=0``
  included): build the loader with this module's :class:`StatefulDataLoader`
  (a subclass of torchdata's: the same arguments) and call
  ``loader.load_state_dict(state)``.
  torchdata's own class asserts the same ``num_workers`` and hands each new
  worker only its namesake's part of the state; this one reshapes a state
  of another dealing so every new worker is given the whole (every old
  worker's progress) and re-deals the rest of the epoch from it: each
  sample is read once across all ranks. With torchdata's own class, a change
  of world or batch size works too (the workers swap their parts as they
  start, :mod:`.iterator.exchange`), a change of ``num_workers`` fails as
  the loader starts with a line naming this class; or give the state to the
  dataset instead, ``ds.load_state_dict(state)``, before building the loader.

Every rank given the same state reaches the same re-deal or the same error
from it, as its loader starts and before its first batch, so no rank trains
on while another stopped.

With ``num_workers > 0`` and non-persistent workers, call
``ds.set_epoch(epoch)`` before each epoch (like ``DistributedSampler``): the
workers' copies cannot move the dataset in the training process forward.
"""

from __future__ import annotations

import os
import secrets
from types import SimpleNamespace
from typing import Any, Iterator, Mapping

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from .errors import ConfigError
from .iterator import TokenIterator
from .iterator.exchange import exchange
from .iterator.state import StreamState, from_loader_state, gather

try:  # optional: only StatefulDataLoader needs torchdata
    from torchdata.stateful_dataloader import StatefulDataLoader as _TorchdataLoader
    from torchdata.stateful_dataloader import incremental_state as _td_worker
    from torchdata.stateful_dataloader import stateful_dataloader as _td_loader
except ImportError:  # pragma: no cover - exercised by installs without torchdata
    _TorchdataLoader = None

_NUMPY_OF = {torch.int64: np.int64, torch.int32: np.int32, torch.uint16: np.uint16, torch.uint8: np.uint8,
             torch.int16: np.int16}
EXCHANGE_TIMEOUT = 120.0  # seconds the workers of a loader wait for each other when they start


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
        self._given: dict[str, Any] | None = None  # this worker's part of a loader state, until swapped
        self._swapped_pid: int | None = None  # the worker process that swapped its part with its siblings
        self._token = secrets.token_hex(8)  # names this dataset's workers' meeting (copies share it)
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

    def stream_shape(self, num_workers: int) -> tuple[int, int, int]:
        """How this dataset's epoch is dealt under a loader with ``num_workers``: (world, workers, batch)."""
        return (self.world_size, max(num_workers, 1), self._template.layout.batch)

    def __len__(self) -> int:
        """Samples (or batches) per epoch for one consumer when the loader has no workers."""
        return len(self._template)

    def _bind(self) -> TokenIterator:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        if info is not None and self._swapped_pid != os.getpid():
            self._swap(info)
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

    def _swap(self, info: Any) -> None:
        """Meet this loader's other workers once, as this worker starts, and resume from all their parts.

        Every worker of the loader comes here (torchdata asks each for its state as it starts; a plain
        DataLoader's workers all fetch at once), given a part or not, so none waits for one that never comes.
        """
        base_seed = info.seed - info.id  # the same for every worker of one loader iterator
        name = f"{self._token}-{os.getppid()}-{base_seed}-{info.num_workers}"
        parts = exchange(name, info.id, info.num_workers, self._given, EXCHANGE_TIMEOUT)
        given = gather(parts, None)
        if given is not None and given.shape[1] != info.num_workers and not (all(parts) and given.complete):
            # torchdata's own class handed out its namesakes' parts, and its restore asserts the same
            # num_workers right after this (stager's StatefulDataLoader gives every worker the whole state
            # instead): say why, and the ways that work, from every worker of every rank alike.
            raise ConfigError(f"the DataLoader state was saved with num_workers={given.shape[1]} and this loader "
                              f"has {info.num_workers}: torchdata's StatefulDataLoader.load_state_dict cannot "
                              f"change the worker count; build the loader with stager.torch.StatefulDataLoader "
                              f"(same arguments), or call ds.load_state_dict(state) before building it instead")
        self._pending = gather(parts, self._pending)
        if self._pending is not None:
            self._epoch = self._pending.epoch
        self._given, self._swapped_pid = None, os.getpid()

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

        In a DataLoader worker (torchdata's ``StatefulDataLoader.load_state_dict`` calls it there, with
        that worker's part of the loader state), the part is kept until the loader's workers swap theirs.

        Raises:
            ConfigError: another dataset, seq_len or order; or a re-deal without every worker's progress.
        """
        parsed = from_loader_state(state)
        if parsed is None:
            return  # a loader state taken before any worker reported: nothing was read
        t = self._template
        parsed.check(t.index.fingerprint, t.order_spec.seed, t.order_spec.shuffle, t.order_spec.shuffle_window)
        if get_worker_info() is not None and self._swapped_pid != os.getpid():
            # StatefulDataLoader.load_state_dict, in a starting worker: this worker's part only; the
            # workers swap their parts before they resume (see _swap).
            self._given = parsed.to_dict()
        else:
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


def _torchdata_keys() -> SimpleNamespace:
    """The names torchdata keeps a loader state under, taken from torchdata itself (they are private there).

    Raises:
        ConfigError: this torchdata names them otherwise (another version than stager knows).
    """
    try:
        multi = _td_loader._StatefulMultiProcessingDataLoaderIter
        return SimpleNamespace(
            snapshot=multi._SNAPSHOT, main=multi._MAIN_SNAPSHOT, workers=multi._WORKER_SNAPSHOTS,
            snapshot_step=multi._SNAPSHOT_STEP, steps_since=multi._STEPS_SINCE_SNAPSHOT,
            last_worker=multi._LAST_YIELDED_WORKER_ID, num_workers=multi._NUM_WORKERS, base_seed=multi._BASE_SEED,
            num_yielded=_td_loader._StatefulSingleProcessDataLoaderIter._NUM_YIELDED,
            finished=_td_loader._ITERATOR_FINISHED,
            shared=(_td_loader._SAMPLER_ITER_STATE, _td_loader._INDEX_SAMPLER_STATE, _td_loader._SAMPLER_ITER_YIELDED,
                    _td_loader._ITERABLEDATASET_LEN_CALLED, _td_loader._SHARED_SEED),
            worker_id=_td_worker._WORKER_ID, fetcher=_td_worker._FETCHER_STATE, dataset=_td_worker._DATASET_STATE,
            dataset_iter=_td_worker._DATASET_ITER_STATE, ended=_td_worker._FETCHER_ENDED,
            worker_key=lambda i: multi._worker_key(None, i))
    except AttributeError as exc:
        raise ConfigError(f"this torchdata keeps its loader state under names stager.torch.StatefulDataLoader does "
                          f"not know ({exc}); resume with ds.load_state_dict(state) instead") from exc


def reshaped_loader_state(state: Mapping[str, Any], dataset: Any, num_workers: int) -> Mapping[str, Any]:
    """A ``StatefulDataLoader.state_dict()`` in the shape torchdata restores for a loader of ``num_workers``.

    A state of a :class:`TokenDataset` whose epoch was dealt otherwise than the new loader deals it (another
    ``num_workers``, world size or batch size) becomes a state of the new loader's shape in which every worker
    (or, without workers, the dataset) is given the whole stream state: the progress of every old worker,
    with the steps the old loader yielded since its last snapshot credited, so no step is replayed; each
    then re-deals the rest of the epoch from it. Any other state (the same shape, another dataset, nothing
    read yet) is returned unchanged.

    Raises:
        ConfigError: the state is not shaped like this torchdata's loader states, or its stream states
            disagree or belong to another dataset.
    """
    if not isinstance(dataset, TokenDataset) or not isinstance(state, Mapping) or not state:
        return state
    stream = from_loader_state(state)
    if stream is None:
        return state  # taken before any worker reported: nothing was read, nothing to re-deal
    k = _torchdata_keys()
    try:
        if k.snapshot in state:
            snapshot = state[k.snapshot]
            main, saved_workers = snapshot[k.main], int(snapshot[k.main][k.num_workers])
            yielded = int(snapshot[k.snapshot_step]) + int(state[k.steps_since])
        elif k.num_yielded in state:
            main, saved_workers, yielded = state, 0, int(state[k.num_yielded])
        else:
            raise KeyError(f"{k.snapshot} or {k.num_yielded}")
        if saved_workers == num_workers and stream.shape == dataset.stream_shape(num_workers):
            return state  # the same dealing: torchdata's own restore continues each worker exactly
        shared = {key: main[key] for key in k.shared}
        finished = bool(state[k.finished])
        base_seed = main.get(k.base_seed)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"the DataLoader state is not shaped like a torchdata StatefulDataLoader state "
                          f"(missing or malformed: {exc}); was it saved by another torchdata version?") from exc
    whole = stream.to_dict()
    fetcher = {k.dataset_iter: None, k.ended: False}  # TokenDataset's iterator holds no state of its own
    if num_workers == 0:
        return {**shared, k.num_yielded: yielded, k.fetcher: fetcher, k.dataset: whole, k.finished: finished}
    if base_seed is None:  # saved without workers: draw one as torch does for a new loader iterator
        base_seed = int(torch.empty((), dtype=torch.int64).random_().item())
    workers = {k.worker_key(i): {k.worker_id: i, k.fetcher: dict(fetcher), k.dataset: whole}
               for i in range(num_workers)}
    return {
        k.snapshot: {
            k.main: {**shared, k.num_workers: num_workers, k.base_seed: base_seed},
            k.workers: workers,
            k.snapshot_step: yielded,
            k.last_worker: num_workers - 1,  # the re-dealt rest starts at worker 0, as a new epoch does
        },
        k.steps_since: 0,
        k.finished: finished,
    }


if _TorchdataLoader is not None:
    class StatefulDataLoader(_TorchdataLoader):
        """torchdata's ``StatefulDataLoader`` whose ``load_state_dict`` also takes another ``num_workers``.

        The same constructor, ``state_dict`` and ``load_state_dict``; only the import changes. torchdata's own
        class asserts that a state was saved with the loader's ``num_workers`` and hands each new worker only
        its namesake's part; this one first reshapes a :class:`TokenDataset` state saved at another worker
        count, world size or batch size (:func:`reshaped_loader_state`), so every worker re-deals the rest of
        the epoch from the whole. The same shape passes through untouched: the stream continues exactly.
        """

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            """Resume from ``state_dict``, a ``state_dict()`` of this loader class or of torchdata's.

            Raises:
                ConfigError: a state not shaped like torchdata's, or of another dataset or order.
            """
            super().load_state_dict(reshaped_loader_state(state_dict, self.dataset, self.num_workers))


def __getattr__(name: str) -> Any:
    if name == "StatefulDataLoader":
        raise ImportError("stager.torch.StatefulDataLoader needs torchdata (install the 'torch' extra of stager)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
