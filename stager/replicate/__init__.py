"""Replication: a bulk, verified, resumable copy of a dataset between two stores.

``stager replicate SRC DST`` copies every object of the source manifest to the
destination, any fsspec URL to any other (S3 on different endpoints, file,
gs, az; plain HTTP as a read-only source), each side with its own storage
options and counters. How it works, module by module:

- :mod:`.source`: the source manifest (or the source indexed on the fly),
  kept as bytes: the destination's manifest is a copy of it;
- :mod:`.plan`: the manifest diffed against the destination listing and the
  destination's manifest, in a sqlite file, so millions of objects never sit
  in memory; only what is missing or different is copied;
- :mod:`.copier`: one object at a time, streamed: ranged reads whose every
  block is checked against the manifest inside the store's retry loop, then a
  ``write`` or a multipart upload; nothing unverified is ever written;
- :mod:`.journal`: what is done, and which parts of which uploads, in sqlite
  (WAL) in a local state directory (:mod:`.state`), so a run killed with
  SIGKILL and started again sends at most what was in flight again;
- :mod:`.budget`: the cap on bytes in flight (memory, and what a kill loses);
- :mod:`.shards`: ``--shard i/N``, or Slurm / Kubernetes Indexed Job
  variables, split the plan deterministically;
- :mod:`.finalize`: done-markers at the destination decide which shard is
  last; it publishes the manifest, written only after everything verified;
- :mod:`.watch`: ``--watch`` keeps replicating a checkpoint directory as
  files become complete;
- :mod:`.replicator`: the orchestration of one run.
"""

from .copier import Copier, part_size_for
from .journal import Journal, JournalError
from .plan import Action, Plan, PlanRules, PlanSummary
from .replicator import ReplicateConfig, Replicator
from .shards import Shard, parse_shard, shard_from_env
from .state import ReplicationBusy, state_dir_for

__all__ = [
    "Action",
    "Copier",
    "Journal",
    "JournalError",
    "Plan",
    "PlanRules",
    "PlanSummary",
    "ReplicateConfig",
    "ReplicationBusy",
    "Replicator",
    "Shard",
    "parse_shard",
    "part_size_for",
    "shard_from_env",
    "state_dir_for",
]
