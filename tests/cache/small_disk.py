"""Real small file systems for full-disk tests: a tmpfs mounted for one test, and a disk filler.

We run as root here; where mounting is refused the tests that need it skip.
The mount is lazily unmounted in teardown, also when the test fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


@contextmanager
def mounted_tmpfs(mountpoint: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``"20m"``) mounted at ``mountpoint`` for the duration of the block."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint)],
                              capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, timeout=10)


@contextmanager
def mounted_ext4(mountpoint: Path, image: Path, size_mb: int) -> Iterator[Path]:
    """An ext4 file system of ``size_mb`` MiB on a loop device (O_DIRECT works there, unlike tmpfs)."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as fh:
        fh.truncate(size_mb << 20)
    try:
        made = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], capture_output=True, timeout=30)
        if made.returncode != 0:
            pytest.skip(f"cannot make an ext4 file system: {made.stderr.decode().strip()}")
        done = subprocess.run(["mount", "-o", "loop", str(image), str(mountpoint)], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount an ext4 loop device: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount an ext4 loop device: {done.stderr.decode().strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], capture_output=True, timeout=30)
        image.unlink(missing_ok=True)


def fill_disk(path: Path) -> int:
    """Fill the disk holding ``path`` from another process (a file of zeros written until ENOSPC),
    as another program on the node would; returns the bytes it took."""
    code = ("import os, sys\n"
            "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n"
            "chunk = bytes(1 << 16)\n"
            "try:\n"
            "    for _ in range(1 << 20):\n"  # bounded: 64 GiB at most
            "        os.write(fd, chunk)\n"
            "except OSError:\n"
            "    pass\n"
            "for n in (4096, 512, 1):\n"  # the last blocks too
            "    try:\n"
            "        while os.write(fd, bytes(n)):\n"
            "            pass\n"
            "    except OSError:\n"
            "        pass\n"
            "os.fsync(fd)\n")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)
    return os.stat(path).st_size


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
