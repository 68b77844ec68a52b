"""Retention: which checkpoints to delete, and deleting them from every store.

Only checkpoints complete at every one of their stores are candidates; of
those, the newest is always kept, and so are the ``keep_last`` newest and
every one whose step is a multiple of ``keep_every``. Anything not complete
everywhere (staged, draining, damaged: the copy that may be needed to repair
another) is never touched. A checkpoint is deleted at each store manifest
first (it stops being a complete checkpoint at once), then ``.metadata``
(DCP stops seeing it), then the rest of its files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..config import SourceConfig
from ..errors import ConfigError
from ..store import open_store
from .inventory import CheckpointState
from .manifest import MANIFEST_PATH, METADATA_NAME


def to_delete(checkpoints: Sequence[CheckpointState], keep_last: int, keep_every: int | None = None) -> list[CheckpointState]:
    """The checkpoints retention removes (see the module docstring), oldest first.

    Raises:
        ConfigError: ``keep_last`` < 1 or ``keep_every`` < 1.
    """
    if keep_last < 1:
        raise ConfigError(f"--keep-last must be at least 1 (the newest complete checkpoint is always kept), got {keep_last}")
    if keep_every is not None and keep_every < 1:
        raise ConfigError(f"--keep-every must be at least 1, got {keep_every}")
    complete = sorted((c for c in checkpoints if c.complete_everywhere),
                      key=lambda c: (c.step if c.step is not None else -1, c.manifest.created))  # type: ignore[union-attr]
    keep = {id(c) for c in complete[-keep_last:]}
    if keep_every is not None:
        keep |= {id(c) for c in complete if c.step is not None and c.step % keep_every == 0}
    return [c for c in complete if id(c) not in keep]


async def delete_checkpoint(checkpoint: CheckpointState, options_for: Callable[[str], dict]) -> None:
    """Delete ``checkpoint`` at every store: manifest, then ``.metadata``, then its other files."""
    assert checkpoint.manifest is not None
    for url in checkpoint.manifest.stores:
        async with open_store(SourceConfig(url, options_for(url))) as store:
            rest = [o.path for o in await store.list() if o.path not in (MANIFEST_PATH, METADATA_NAME)]
            await store.delete(MANIFEST_PATH)
            await store.delete(METADATA_NAME)
            for path in rest:
                await store.delete(path)
