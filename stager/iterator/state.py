"""The resumable state of a token stream: which epoch, what was dealt, how far each worker got.

A state is a plain dict of ints, strings and lists (it survives ``torch.save``,
JSON and torchdata's incremental worker snapshots)::

    format, version          "stager.iterator", 2 (2: the first window of an epoch in block stripes;
                             1, an older stager's, resumes its epoch unstriped)
    fingerprint              the sample index it belongs to (dataset digests, seq_len, labels)
    seed, shuffle, shuffle_window     the order it belongs to
    epoch                    the epoch being read
    leftover, tail, end      the remainder of the epoch that was dealt (see deal.py)
    world, workers, batch    how it was dealt
    progress                 {worker: samples read} (the same on every rank)
    position                 for people: every epoch position before it has been read

Resuming with the same (world, workers, batch) continues each worker where
it stopped, so the stream is the same as if it had never stopped. Resuming
with another shape first re-deals what no worker has read yet
(:func:`~stager.iterator.deal.redeal`), which needs the progress of every
worker: the whole state of a DataLoader, or of a single-process iterator.
:func:`from_loader_state` extracts and merges the workers' states from a
``torchdata`` ``StatefulDataLoader`` state; :func:`gather` merges the parts
its ``load_state_dict`` handed to the workers of a new loader (each gets
only its namesake's part), which they swap when they start
(:mod:`.exchange`). Every worker of every rank given the same saved state
computes the same re-deal from it, or the same error: no rank goes on alone
while another stops.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from ..errors import ConfigError
from .deal import Layout, Remainder, redeal

FORMAT = "stager.iterator"
#: 2: the first shuffle window of each epoch is read in block stripes (order.py), so a position of
#: that window names another sample than it did in a version 1 state. A version 1 state (an older
#: stager's) still resumes: the rest of its epoch in the order it began in, unstriped, and the epochs
#: after it striped; a state saved meanwhile says version 1 again.
VERSION = 2
UNSTRIPED_VERSION = 1


@dataclass(frozen=True, slots=True)
class StreamState:
    """Where one consumer's stream stands; see the module docstring for the fields."""

    fingerprint: str
    seed: int
    shuffle: bool
    shuffle_window: int
    epoch: int
    remainder: Remainder
    shape: tuple[int, int, int]
    progress: Mapping[int, int] = field(default_factory=dict)
    striped: bool = True  # this epoch's first window in block stripes (False: a version 1 state's epoch)

    def to_dict(self) -> dict[str, Any]:
        world, workers, batch = self.shape
        return {
            "format": FORMAT,
            "version": VERSION if self.striped else UNSTRIPED_VERSION,
            "fingerprint": self.fingerprint,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "shuffle_window": self.shuffle_window,
            "epoch": self.epoch,
            "leftover": self.remainder.leftover.tolist(),
            "tail": self.remainder.tail,
            "end": self.remainder.end,
            "world": world,
            "workers": workers,
            "batch": batch,
            "progress": {str(k): int(v) for k, v in sorted(self.progress.items())},
            "position": self.position(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "StreamState":
        """Parse a state made by :meth:`to_dict`.

        Raises:
            ConfigError: not a stager iterator state, an unknown version, or a malformed field.
        """
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise ConfigError("not a stager iterator state (expected a dict with format 'stager.iterator')")
        version = data.get("version")
        if isinstance(version, bool) or version not in (VERSION, UNSTRIPED_VERSION):
            raise ConfigError(f"iterator state version {version!r} is not supported "
                              f"(expected {UNSTRIPED_VERSION} or {VERSION})")
        try:
            remainder = Remainder(np.asarray(data["leftover"], dtype=np.int64), int(data["tail"]), int(data["end"]))
            progress = {int(k): int(v) for k, v in dict(data["progress"]).items()}
            shape = (int(data["world"]), int(data["workers"]), int(data["batch"]))
            Layout(shape[0], 0, shape[1], 0, shape[2])  # validates the shape
            return cls(str(data["fingerprint"]), int(data["seed"]), bool(data["shuffle"]),
                       int(data["shuffle_window"]), int(data["epoch"]), remainder, shape, progress,
                       striped=version == VERSION)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"malformed iterator state: {exc!r}") from exc

    @property
    def complete(self) -> bool:
        """Whether it holds the progress of every worker it was dealt to (enough to re-deal from)."""
        return all(k in self.progress for k in range(self.shape[1]))

    def position(self) -> int:
        """The first epoch position that some worker may not have read yet (all before it were read)."""
        world, workers, batch = self.shape
        if any(k not in self.progress for k in range(workers)):
            if not len(self.remainder):
                return self.remainder.end
            return int(self.remainder.positions(np.zeros(1, np.int64))[0])
        done = min(self.progress[k] // batch for k in range(workers)) * world * workers * batch
        if done >= len(self.remainder):
            return self.remainder.end
        return int(self.remainder.positions(np.array([done]))[0])

    def check(self, fingerprint: str, seed: int, shuffle: bool, shuffle_window: int) -> None:
        """Refuse a state of another dataset, sample spec or order.

        Raises:
            ConfigError: naming what differs.
        """
        if self.fingerprint != fingerprint:
            raise ConfigError("the saved iterator state belongs to another dataset, seq_len or label setting "
                              f"(fingerprint {self.fingerprint}, this iterator has {fingerprint})")
        mine = (seed, shuffle, shuffle_window)
        theirs = (self.seed, self.shuffle, self.shuffle_window)
        if mine != theirs:
            raise ConfigError(f"the saved iterator state was made with seed/shuffle/shuffle_window {theirs}, "
                              f"this iterator has {mine}")

    def resume(self, layout: Layout) -> tuple[Remainder, int]:
        """The remainder to deal to ``layout`` and how many of its samples this consumer already read.

        Raises:
            ConfigError: the shape changed and the state lacks some worker's progress.
        """
        if layout.shape == self.shape and layout.worker in self.progress:
            return self.remainder, int(self.progress[layout.worker])
        if not any(self.progress.values()):  # nothing read yet: nothing to re-deal
            return self.remainder, 0
        return redeal(self.remainder, self.shape, dict(self.progress)), 0

    def rebased(self, layout: Layout) -> "StreamState":
        """The same point in the stream, dealt to ``layout``'s shape (progress restarts at zero if re-dealt)."""
        if layout.shape == self.shape:
            return self
        return replace(self, remainder=redeal(self.remainder, self.shape, dict(self.progress)),
                       shape=layout.shape, progress={})


def merge(states: list[StreamState]) -> StreamState:
    """One state from the states of the workers of one loader (their progress united).

    Raises:
        ConfigError: no states, or states of different streams.
    """
    if not states:
        raise ConfigError("no iterator state to load")
    first = states[0]
    progress: dict[int, int] = {}
    for state in states:
        if replace(state, progress={}) != replace(first, progress={}):
            raise ConfigError("the workers' iterator states disagree (different epochs or dealing); "
                              "they do not come from one DataLoader snapshot")
        for worker, done in state.progress.items():
            if progress.setdefault(worker, done) != done:
                raise ConfigError(f"the iterator states disagree on worker {worker}'s progress "
                                  f"({progress[worker]} and {done} samples); they do not come from one snapshot")
    return replace(first, progress=progress)


def gather(given: list[Mapping[str, Any] | None], loaded: StreamState | None) -> StreamState | None:
    """The state a worker of a new loader resumes from, out of what all its loader's workers were given.

    Args:
        given: per worker of the new loader, the dataset state ``StatefulDataLoader.load_state_dict``
            handed it (None: nothing, e.g. a worker the saved loader did not have).
        loaded: the whole loader state given to the dataset itself with ``ds.load_state_dict``, if any;
            the workers' parts must then come from the same snapshot (they add nothing to it).

    Raises:
        ConfigError: a malformed state, or parts that do not come from one snapshot.
    """
    states = [StreamState.from_dict(g) for g in given if g]
    if loaded is not None:
        states.insert(0, loaded)
    return merge(states) if states else None


def from_loader_state(data: Mapping[str, Any]) -> StreamState | None:
    """The stream state inside a torchdata ``StatefulDataLoader.state_dict()``, or None if there is none.

    With workers, their snapshots are merged; steps the loader yielded after
    its last snapshot are credited to the workers in turn, one ``batch`` each
    (the loader's batch size must then be the dataset's ``batch_size``).

    Raises:
        ConfigError: the snapshots disagree.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"an iterator or DataLoader state must be a dict, got {type(data).__name__}")
    if data.get("format") == FORMAT:
        return StreamState.from_dict(data)
    snapshot = data.get("_snapshot")
    if isinstance(snapshot, Mapping):  # multi-process loader
        snapshots = snapshot.get("_worker_snapshots") or {}
        workers = (snapshot.get("_main_snapshot") or {}).get("_num_workers")
        if isinstance(workers, int) and not isinstance(workers, bool):
            # Only the loader's own workers: an entry beyond its count would be a stale one it was handed.
            snapshots = {k: v for k, v in snapshots.items() if k in {f"worker_{i}" for i in range(workers)}}
        states = []
        for worker_state in snapshots.values():
            ds_state = (worker_state or {}).get("dataset_state")
            if ds_state:
                states.append(StreamState.from_dict(ds_state))
        if not states:
            return None
        state = merge(states)
        steps = int(data.get("_steps_since_snapshot") or 0)
        if steps:
            world, workers, batch = state.shape
            last = int(snapshot.get("_last_yielded_worker_id", workers - 1))
            progress = dict(state.progress)
            for s in range(steps):
                k = (last + 1 + s) % workers
                progress[k] = progress.get(k, 0) + batch
            state = replace(state, progress=progress)
        return state
    ds_state = data.get("dataset_state")
    return StreamState.from_dict(ds_state) if ds_state else None
