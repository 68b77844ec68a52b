"""Splitting one replication into N shards run by independent processes.

A shard is ``i/N``: given with ``--shard`` (or ``STAGER_SHARD``), or read from
the scheduler that started the process:

- Slurm job arrays: ``SLURM_ARRAY_TASK_ID`` (offset by ``SLURM_ARRAY_TASK_MIN``
  and divided by ``SLURM_ARRAY_TASK_STEP``) of ``SLURM_ARRAY_TASK_COUNT``;
- Slurm tasks of an ``srun`` step: ``SLURM_PROCID`` of ``SLURM_NTASKS`` (only
  inside a step, ``SLURM_STEP_ID`` set: the batch script itself also sees
  ``SLURM_NTASKS`` but is one process); an array of multi-task steps gives
  ``array_index * ntasks + procid`` of ``array_count * ntasks``;
- a Kubernetes Indexed Job: ``JOB_COMPLETION_INDEX`` of ``STAGER_SHARD_COUNT``
  (Kubernetes does not pass ``completions`` to the pod: the Job sets it).

The split depends only on the source manifest, so every shard computes the
same one without talking to the others: objects are sorted by size (largest
first, ties by manifest position) and dealt out boustrophedon (0..N-1, then
N-1..0, ...), which balances bytes to within about one object. Extra
destination files (``--delete``) go to the shard named by a hash of their path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import xxhash

from ..errors import ConfigError

_SHARD_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` of ``count`` (``0 <= index < count``)."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ConfigError(f"shard {self.index}/{self.count}: need 0 <= i < N")

    @property
    def label(self) -> str:
        return f"{self.index}-of-{self.count}"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """Parse ``"i/N"``.

    Raises:
        ConfigError: not of that form, or ``i`` out of range.
    """
    match = _SHARD_RE.match(text or "")
    if not match:
        raise ConfigError(f"--shard {text!r}: expected i/N, e.g. 0/4")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or index >= count:
        raise ConfigError(f"--shard {text!r}: need 0 <= i < N (shards are numbered from 0)")
    return Shard(index, count)


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigError(f"{name}={value!r}: not an integer") from exc


def shard_from_env(environ: Mapping[str, str] | None = None) -> Shard:
    """The shard this process is, from Slurm or a Kubernetes Indexed Job; 0/1 when neither says.

    Raises:
        ConfigError: the variables are inconsistent (an index without a count, out of range).
    """
    env = os.environ if environ is None else environ
    k8s_index = _int(env, "JOB_COMPLETION_INDEX")
    if k8s_index is not None:
        count = _int(env, "STAGER_SHARD_COUNT")
        if count is None:
            raise ConfigError("JOB_COMPLETION_INDEX is set but STAGER_SHARD_COUNT is not: set it to the Job's "
                              "completions (see deploy/kubernetes/replicate-indexed-job.yaml)")
        return Shard(k8s_index, count)
    index, count = 0, 1
    array_id = _int(env, "SLURM_ARRAY_TASK_ID")
    if array_id is not None:
        array_count = _int(env, "SLURM_ARRAY_TASK_COUNT")
        if array_count is None:
            raise ConfigError("SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not")
        first = _int(env, "SLURM_ARRAY_TASK_MIN") or 0
        step = _int(env, "SLURM_ARRAY_TASK_STEP") or 1
        index, count = (array_id - first) // max(step, 1), array_count
    if env.get("SLURM_STEP_ID", "").strip() not in ("", "batch", "extern"):
        ntasks = _int(env, "SLURM_NTASKS") or 1
        procid = _int(env, "SLURM_PROCID") or 0
        index, count = index * ntasks + procid, count * ntasks
    return Shard(index, count)


def assign_shards(sizes: np.ndarray, count: int) -> np.ndarray:
    """The shard of each object (by position), balancing bytes; depends only on ``sizes``."""
    n = len(sizes)
    if count == 1 or n == 0:
        return np.zeros(n, dtype=np.int32)
    # Largest first; a stable sort on the negated sizes keeps manifest order among equals.
    order = np.argsort(-np.asarray(sizes, dtype=np.int64), kind="stable")
    rank = np.arange(n)
    lap, pos = np.divmod(rank, count)
    snake = np.where(lap % 2 == 0, pos, count - 1 - pos).astype(np.int32)
    shards = np.empty(n, dtype=np.int32)
    shards[order] = snake
    return shards


def shard_of_path(path: str, count: int) -> int:
    """The shard responsible for a destination-only path (deletions)."""
    return xxhash.xxh3_64_intdigest(path.encode()) % count if count > 1 else 0
