"""Checkpoints through stager: a save waits for node-local disk only; the drain makes it safe everywhere.

How it works, module by module:

- :mod:`.writer`: :class:`CheckpointWriter`, a DCP storage writer that writes
  each rank's files into the node-local staging directory, hashing every
  block as it goes, and hands the sealed checkpoint to the drain;
- :mod:`.staging`: the staging directory's layout, its queue (oldest first)
  and its bounded room (a save waits for the drain, or fails loudly; nothing
  not yet at every store is ever removed);
- :mod:`.manifest`: the checkpoint's manifest (files, digests, stores);
- :mod:`.parts`: a save whose ranks are on several nodes: each node's part
  record at every store, and when they cover everything ``.metadata`` names;
- :mod:`.transfer`: one file sent between stores, verified, resumable;
- :mod:`.journal`: the drain's progress, surviving SIGKILL;
- :mod:`.drain`: the queue sent to the destination and every replica,
  ``.metadata`` and the manifest last, so a checkpoint is visible only once
  every byte is verified; :mod:`.drainer`: the process that runs it and
  outlives training; :mod:`.daemon_hook`: the node daemon runs it instead;
- :mod:`.reader`: :class:`CheckpointReader`, a DCP storage reader that reads
  through the cache from the nearest complete copy;
- :mod:`.verify`: every store checked against the manifest, damaged or
  missing files repaired from a good copy; :mod:`.retention`: which
  checkpoints to delete, only among those complete at every store.

The destination and replicas hold DCP's own layout (``.metadata``,
``*.distcp``), so ``dcp.load`` with DCP's own readers works without stager.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CheckpointReader", "CheckpointWriter"]


def __getattr__(name: str) -> Any:
    # The writer and reader import torch: loaded only when asked for.
    if name == "CheckpointWriter":
        from .writer import CheckpointWriter

        return CheckpointWriter
    if name == "CheckpointReader":
        from .reader import CheckpointReader

        return CheckpointReader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
