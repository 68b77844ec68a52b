"""Real mounts for tests: ``stager mount`` in its own process, always unmounted at teardown.

A :class:`Mount` runs the real command line (``python -m stager mount ...``,
which returns once the mount is ready) and finds the mount's process through
the mount's source in /proc/self/mountinfo (``stager:PID``). :meth:`Mount.stop` unmounts with
``fusermount3 -u``, then ``umount -l`` as a last resort, and ends the process
(SIGTERM, then SIGKILL), each step bounded in time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from stager.fuse import mount_pid

STAGER = [sys.executable, "-m", "stager"]
START_TIMEOUT = 60.0


def wait_until(condition, timeout: float, what: str, interval: float = 0.02) -> None:
    """Poll ``condition`` until true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


class Mount:
    """One mount of ``source`` under ``workdir`` (mount point ``workdir/mnt``, cache ``workdir/cache``)."""

    def __init__(self, source: str, workdir: Path, *args: str, cache: Path | None = None,
                 env: dict[str, str] | None = None, daemon: Path | None = None) -> None:
        self.source = source
        self.path = workdir / "mnt"
        self.cache = cache or workdir / "cache"
        self.log = workdir / "mount.log"
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.daemon = daemon  # the node daemon's socket; None: an engine in the mount's process
        self.pid: int | None = None
        self.path.mkdir(parents=True, exist_ok=True)

    def command(self, *extra: str) -> list[str]:
        session = ["--socket", str(self.daemon)] if self.daemon else ["--no-daemon"]
        return [*STAGER, "mount", self.source, str(self.path), "--cache", str(self.cache), "--capacity", "1GB",
                *session, "--log-file", str(self.log), *self.args, *extra]

    def start(self) -> "Mount":
        result = subprocess.run(self.command(), capture_output=True, text=True, timeout=START_TIMEOUT, env=self.env)
        if result.returncode != 0:
            raise AssertionError(f"stager mount failed ({result.returncode}): {result.stderr.strip()}\n"
                                 f"log: {self.log_text()}")
        assert os.path.ismount(self.path)
        self.pid = mount_pid(self.path)
        assert self.pid is not None, "the mount does not name its process"
        return self

    def log_text(self) -> str:
        try:
            return self.log.read_text()
        except OSError:
            return ""

    def stop(self) -> None:
        """Unmount and end the process, whatever state they are in (bounded)."""
        if os.path.ismount(self.path):
            subprocess.run(["fusermount3", "-u", str(self.path)], capture_output=True, timeout=10)
        if os.path.ismount(self.path):
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, timeout=10)
        if self.pid is not None and alive(self.pid):
            try:
                wait_until(lambda: not alive(self.pid), 10, "the mount process to exit")
            except AssertionError:
                os.kill(self.pid, signal.SIGKILL)
                wait_until(lambda: not alive(self.pid), 10, "the killed mount process to go")

    def __enter__(self) -> "Mount":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
