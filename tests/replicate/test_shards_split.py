"""Which shard a process is, and how the plan is split: from flags, Slurm and Kubernetes."""

from __future__ import annotations

import numpy as np
import pytest

from stager.errors import ConfigError
from stager.replicate.shards import (
    Shard,
    assign_shards,
    parse_shard,
    shard_from_env,
    shard_of_path,
)


def test_parse_shard():
    assert parse_shard("2/8") == Shard(2, 8)
    assert parse_shard(" 0 / 1 ") == Shard(0, 1)
    for bad in ("8/8", "1", "a/b", "-1/2", "1/0", ""):
        with pytest.raises(ConfigError, match="--shard|shard"):
            parse_shard(bad)


@pytest.mark.parametrize(("env", "expected"), [
    ({}, Shard(0, 1)),
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4"}, Shard(3, 4)),
    ({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1",
      "SLURM_ARRAY_TASK_STEP": "2"}, Shard(3, 4)),  # --array=1-7:2
    # The batch script sees SLURM_NTASKS too, but is one process: no step id, no split.
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}, Shard(0, 1)),
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_NTASKS": "8"}, Shard(5, 8)),
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2",
      "SLURM_NTASKS": "4"}, Shard(6, 8)),
    ({"JOB_COMPLETION_INDEX": "3", "STAGER_SHARD_COUNT": "10"}, Shard(3, 10)),
])
def test_shard_from_scheduler_variables(env, expected):
    assert shard_from_env(env) == expected


@pytest.mark.parametrize("env", [
    {"JOB_COMPLETION_INDEX": "3"},
    {"JOB_COMPLETION_INDEX": "9", "STAGER_SHARD_COUNT": "4"},
    {"SLURM_ARRAY_TASK_ID": "1"},
    {"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "2"},
])
def test_inconsistent_scheduler_variables_are_a_clear_error(env):
    with pytest.raises(ConfigError):
        shard_from_env(env)


def test_split_is_a_deterministic_partition_balanced_by_bytes():
    rng = np.random.default_rng(0)
    sizes = np.concatenate([rng.integers(1, 10_000, 5000), rng.integers(1 << 28, 1 << 30, 40)])
    for count in (1, 3, 4, 16):
        shards = assign_shards(sizes, count)
        assert np.array_equal(shards, assign_shards(sizes.copy(), count))  # every process computes the same
        assert set(np.unique(shards)) == set(range(count))
        per_shard = np.bincount(shards, weights=sizes, minlength=count)
        assert per_shard.max() - per_shard.min() <= sizes.max()  # within about one object
    assert len(assign_shards(np.array([], dtype=np.int64), 4)) == 0
    assert {shard_of_path(f"x/{i}", 4) for i in range(100)} == {0, 1, 2, 3}
    assert shard_of_path("same", 4) == shard_of_path("same", 4)
