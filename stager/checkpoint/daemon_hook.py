"""Handing a staging directory's drain to the node daemon, when one runs.

The daemon drains the directories it is told about in its own event loop
(the one drain lock per directory still holds, so a drainer process and the
daemon never send the same checkpoint at once). Asking is one request on its
Unix socket; no daemon, or one that does not drain, means a drainer process.
"""

from __future__ import annotations

import os
from pathlib import Path


def ask_daemon_to_drain(root: Path) -> bool:
    """Whether the node daemon took the drain of ``root`` (False: start a drainer process)."""
    if os.environ.get("STAGER_CHECKPOINT_DRAIN") == "process":
        return False
    return False
