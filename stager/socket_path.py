"""Where the node daemon's socket is when nobody says: the one rule both the daemon and its consumers follow.

So neither needs telling when both run with default settings:

1. ``STAGER_SOCKET``, when set;
2. ``/run/stager/stager.sock`` when ``/run/stager`` exists and this user may
   enter it (the systemd unit creates it), or when running as root;
3. ``$XDG_RUNTIME_DIR/stager/stager.sock`` when ``XDG_RUNTIME_DIR`` is set;
4. ``/tmp/stager-<uid>/stager.sock`` otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

SYSTEM_SOCKET_DIR = Path("/run/stager")
SOCKET_NAME = "stager.sock"
#: Linux limits a Unix socket address to 107 bytes (sun_path is 108 with its NUL).
MAX_SOCKET_PATH = 107


def default_socket_path(environ: Mapping[str, str] | None = None, *, uid: int | None = None,
                        system_dir: Path = SYSTEM_SOCKET_DIR) -> Path:
    """The socket path a daemon serves and consumers look for when none is given (see the module doc)."""
    env = os.environ if environ is None else environ
    if env.get("STAGER_SOCKET"):
        return Path(env["STAGER_SOCKET"]).expanduser()
    uid = os.getuid() if uid is None else uid
    if uid == 0 or (system_dir.is_dir() and os.access(system_dir, os.X_OK)):
        return system_dir / SOCKET_NAME
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "stager" / SOCKET_NAME
    return Path(f"/tmp/stager-{uid}") / SOCKET_NAME
