"""The order of one epoch: a two-level shuffle of the global index space.

Position ``p`` of epoch ``e`` (``0 <= p < total samples``) names one sample,
through two keyed permutations (:mod:`.permutation`) that depend only on
``(seed, epoch)``:

1. **Shards**: the shards that hold samples are permuted, then cut into
   shuffle windows of ``shuffle_window`` consecutive shards.
2. **Samples**: the positions of window ``w`` cover, in a permuted order
   keyed by ``(seed, epoch, w)``, every sample of the window's shards.

So the stream visits the windows in order and, inside a window, jumps at
random between its few shards: reads stay local enough that staging a window
ahead keeps up (a shard is needed during one window only), while samples of
a shard are spread over its window instead of arriving back to back.

The **first window of every epoch** is cut into block stripes instead
(:class:`Stripes`): stripe ``s`` holds every sample of the window whose first
token lies in block ``s`` of its shard (blocks of the manifest's block size,
counted from the start of the file the reader maps, tokens placed as
:attr:`SampleIndex.token_bytes` says), its samples permuted with a key of
``(seed, epoch, stripe)``, and the stripes go in order. A cold start's first
steps then need about one block of each of the window's shards, not the
whole window: the iterator serves them from verified blocks while the engine,
which fetches each shard from its start, stays ahead of the consumer. The
later windows are staged whole ahead of the cursor, and keep the full
shuffle. The stripes are a function of the manifest, the seed and the epoch
alone, like the rest of the order. Nothing
here depends on the number of ranks or workers; they only take slices of
the positions (:mod:`.deal`). A position is mapped in O(log shards) without
materialising any per-sample array, so an epoch of billions of samples
costs nothing until it is read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .permutation import derive_key, permute, window_keys
from .samples import SampleIndex


@dataclass(frozen=True, slots=True)
class OrderSpec:
    """How epochs are shuffled: the seed, and how many shards share a shuffle window."""

    seed: int = 0
    shuffle: bool = True
    shuffle_window: int = 8

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        if isinstance(self.shuffle_window, bool) or not isinstance(self.shuffle_window, int) \
                or self.shuffle_window < 1:
            raise ConfigError(f"shuffle_window must be a positive number of shards, got {self.shuffle_window!r}")

    @property
    def shards_per_window(self) -> int:
        # Unshuffled reads are sequential: a window of one shard lets each shard go as soon as it is read.
        return self.shuffle_window if self.shuffle else 1


@dataclass(frozen=True, slots=True)
class Samples:
    """Where a run of positions lives: manifest shard, first token, shuffle window (parallel arrays)."""

    shards: np.ndarray
    offsets: np.ndarray
    windows: np.ndarray


@dataclass(frozen=True, slots=True)
class Stripes:
    """The first window of an epoch cut by block (see the module docstring): ``starts[s]`` is the first
    window position of stripe ``s`` (one more entry: the window's end), ``cells[c]`` the first position of
    cell ``c = s * slots + j`` (stripe ``s``, the window's slot ``j``: its samples in block ``s``) and
    ``first[c]`` the cell's first sample in its shard; ``keys[s]`` keys the permutation of stripe ``s``."""

    starts: np.ndarray
    cells: np.ndarray
    first: np.ndarray
    keys: np.ndarray
    slots: int

    @classmethod
    def of(cls, counts: np.ndarray, base: np.ndarray, step: np.ndarray, block_size: int, key: int) -> "Stripes":
        """Stripes of a window whose slots hold ``counts`` samples, sample ``k`` of slot ``j`` starting at byte
        ``base[j] + k * step[j]`` of its file."""
        counts, base, step = (np.asarray(a, dtype=np.int64) for a in (counts, base, step))
        last = (base + np.maximum(counts - 1, 0) * step) // block_size  # the block of each slot's last sample
        stripes = int(last.max()) + 1
        edges = np.arange(stripes + 1, dtype=np.int64)[:, None] * block_size  # (stripes + 1, slots)
        # The first sample of each slot starting at or after each block's start: ceil((edge - base) / step).
        first = np.clip(-((base[None, :] - edges) // step[None, :]), 0, counts[None, :])
        per_cell = (first[1:] - first[:-1]).ravel()
        cells = np.concatenate([[0], np.cumsum(per_cell)]).astype(np.int64)
        return cls(cells[::len(counts)].copy(), cells, first[:-1].ravel().copy(),
                   window_keys(key, np.arange(stripes)), len(counts))


class EpochOrder:
    """Position -> sample for one epoch of a :class:`SampleIndex`."""

    def __init__(self, index: SampleIndex, spec: OrderSpec, epoch: int, *, striped: bool = True) -> None:
        """``striped``: the first window in block stripes (False: the full shuffle, as a version 1 state's
        epoch was read)."""
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        self.index = index
        self.spec = spec
        self.epoch = epoch
        shards = index.shards
        if spec.shuffle:
            slots = permute(np.arange(len(shards)), len(shards), derive_key("shards", spec.seed, epoch))
            shards = shards[slots]
        self.slot_shard = shards
        self.slot_start = np.concatenate([[0], np.cumsum(index.counts[shards])]).astype(np.int64)
        g = spec.shards_per_window
        self.window_start = np.append(self.slot_start[:-1:g], self.slot_start[-1]).astype(np.int64)
        self._key = derive_key("samples", spec.seed, epoch)
        self.stripes: Stripes | None = None  # the first window's, when shuffled
        if spec.shuffle and striped and len(shards):
            window = shards[:g]
            base, itemsize = index.token_bytes
            self.stripes = Stripes.of(index.counts[window], base[window], itemsize[window] * index.spec.stride,
                                      index.manifest.block_size, derive_key("stripes", spec.seed, epoch))

    def __len__(self) -> int:
        return int(self.slot_start[-1])

    @property
    def windows(self) -> int:
        return len(self.window_start) - 1

    def window_shards(self, window: int) -> np.ndarray:
        """The manifest indexes of the shards of one shuffle window."""
        g = self.spec.shards_per_window
        return self.slot_shard[window * g:(window + 1) * g]

    def max_window_bytes(self, sizes: np.ndarray) -> int:
        """The bytes of the largest shuffle window (what must be staged at once)."""
        g = self.spec.shards_per_window
        per_slot = np.asarray(sizes, dtype=np.int64)[self.slot_shard]
        return int(np.add.reduceat(per_slot, np.arange(0, len(per_slot), g)).max())

    def lookup(self, positions: np.ndarray) -> Samples:
        """The samples at ``positions`` (each in ``[0, len(self))``).

        Raises:
            IndexError: a position is outside the epoch.
        """
        p = np.asarray(positions, dtype=np.int64)
        if not p.size:
            return Samples(p.copy(), p.copy(), p.copy())
        lo, hi = int(p.min()), int(p.max())
        if lo < 0 or hi >= len(self):
            raise IndexError(f"positions outside the epoch of {len(self)} samples")
        first = int(np.searchsorted(self.window_start, lo, side="right")) - 1
        if hi < self.window_start[first + 1]:
            if first == 0 and self.stripes is not None:
                shards, offsets = self._lookup_striped(p)
                return Samples(shards, offsets, np.zeros(p.shape, dtype=np.int64))
            return self._lookup_in_window(p, first)
        w = np.searchsorted(self.window_start, p, side="right") - 1
        start = self.window_start[w]
        q = p - start
        if self.spec.shuffle:
            q = permute(q, self.window_start[w + 1] - start, window_keys(self._key, w))
        u = start + q
        slot = np.searchsorted(self.slot_start, u, side="right") - 1
        shards = self.slot_shard[slot]
        offsets = self.index.token_offset(u - self.slot_start[slot])
        if self.stripes is not None and first == 0:  # some positions in the striped first window
            head = w == 0
            shards[head], offsets[head] = self._lookup_striped(p[head])
        return Samples(shards, offsets, w)

    def _lookup_striped(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Shards and first tokens of positions ``p`` of the first window, in its block stripes."""
        st = self.stripes
        assert st is not None
        s = np.searchsorted(st.starts, p, side="right") - 1
        begin = st.starts[s]
        v = begin + permute(p - begin, st.starts[s + 1] - begin, st.keys[s])
        cell = np.searchsorted(st.cells, v, side="right") - 1
        local = st.first[cell] + (v - st.cells[cell])
        return self.slot_shard[cell % st.slots], self.index.token_offset(local)

    def _lookup_in_window(self, p: np.ndarray, w: int) -> Samples:
        """`lookup` for positions that all lie in window ``w`` (how a reader asks): one domain, one key."""
        start, stop = int(self.window_start[w]), int(self.window_start[w + 1])
        q = p - start
        if self.spec.shuffle:
            q = permute(q, stop - start, int(window_keys(self._key, np.array([w]))[0]))
        u = start + q
        g = self.spec.shards_per_window
        bounds = self.slot_start[w * g:(w + 1) * g + 1]  # the window's slots: a short search
        slot = np.searchsorted(bounds, u, side="right") - 1 + w * g
        return Samples(self.slot_shard[slot], self.index.token_offset(u - self.slot_start[slot]),
                       np.full(p.shape, w, dtype=np.int64))
