"""Is the process that recorded something still alive? (pid + start time + boot id)

A pid alone is not an identity: pids are reused. The start time of the
process (in clock ticks since boot, from /proc) and the boot id together with
the pid name one process for ever, so a hold recorded by a process that has
since died (SIGKILL, OOM) is recognised as dead even if its pid was reused.
Processes in another pid namespace look dead too: processes that share a
cache across containers must go through one daemon.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
_HAVE_PROC = os.path.exists("/proc/self/stat")


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """One process, for ever: pid, start time and the boot it ran in."""

    pid: int
    start: int
    boot: str


def boot_id() -> str:
    """This boot's id ("" where the kernel does not tell)."""
    try:
        return _BOOT_ID_PATH.read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, or None if it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except FileNotFoundError:
        return None if _HAVE_PROC else _psutil_start(pid)
    except OSError:
        return _psutil_start(pid)
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):  # killed but not yet reaped: dead for our purpose
        return None
    return int(fields[19])


def _psutil_start(pid: int) -> int | None:
    import psutil  # only where /proc does not tell: not worth its import time elsewhere

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return int(proc.create_time() * 100)
    except psutil.Error:
        return None


def current_process() -> ProcessIdentity:
    """The identity of the calling process."""
    pid = os.getpid()
    return ProcessIdentity(pid, process_start(pid) or 0, boot_id())


def is_alive(identity: ProcessIdentity, this_boot: str | None = None) -> bool:
    """Whether the process ``identity`` names is still running."""
    if identity.boot != (boot_id() if this_boot is None else this_boot):
        return False
    return process_start(identity.pid) == identity.start
