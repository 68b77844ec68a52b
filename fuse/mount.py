"""Mounting a dataset: checks, the FUSE session on the engine's event loop, readiness, signals, unmount.

:func:`serve` does the whole life of one mount in the current process: it
checks that FUSE can work here (pyfuse3 importable, ``/dev/fuse`` present,
``fusermount3`` for non-root users) and that the mount point is an empty
slot, opens the cache tier and a session (:func:`stager.session.open_session`, the
one place that chooses between the node daemon and an engine of our own), loads the
manifest, builds the tree, mounts read-only and serves requests with pyfuse3
running on the same asyncio (uvloop) loop as the engine. Once the kernel has
completed the FUSE handshake it raises the kernel's read-ahead for this mount
(``/sys/class/bdi/<dev>/read_ahead_kb``, so sequential reads reach us as 1 MiB
requests) and calls ``on_ready``. It returns after an unmount
(``stager unmount``, ``fusermount3 -u``) or SIGTERM/SIGINT, which answer reads
still waiting with EIO, unmount, and close everything.

:func:`mount_in_background` is what ``stager mount`` does by default: it
starts ``python -m stager.fuse`` in a new session with the config on its stdin and
returns once the child reports the mount ready (or fails, with the child's
one-line error). :func:`unmount` ends a mount and waits for its process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import pickle
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from stager.cache import CacheTier
from stager.config import CacheConfig, FetchConfig, SourceConfig
from stager.errors import MountError, StagerError
from stager.session import open_session

from .readahead import ReadAhead, ReadAheadConfig
from .tree import Tree

log = logging.getLogger(__name__)

FUSE_DEVICE = "/dev/fuse"
FSNAME = "stager"  # the mount's source in /proc/mounts is "stager:PID"
READY_TIMEOUT = 600.0  # seconds a background mount may take to load its manifest and mount
EXIT_TIMEOUT = 30.0  # seconds ``unmount`` waits for the mount's process to finish


@dataclass(frozen=True, slots=True)
class MountConfig:
    """Everything one mount needs; built by the CLI (or a test), then passed down."""

    source: SourceConfig
    mountpoint: Path
    cache: CacheConfig = field(default_factory=CacheConfig)
    fetch: FetchConfig = field(default_factory=FetchConfig)
    readahead: ReadAheadConfig = field(default_factory=ReadAheadConfig)
    allow_other: bool = False  # let other users read the mount (non-root needs user_allow_other in fuse.conf)
    default_permissions: bool = True  # the kernel checks modes (0444 files, 0555 directories)
    kernel_readahead_kb: int = 1024  # the mount's kernel read-ahead (0: leave the kernel's default)
    timeout: float = 3600.0  # seconds the kernel caches entries and attributes
    max_requests: int = 256  # FUSE requests served at once
    read_threads: int = 8  # threads for reads that miss the page cache
    session: str = "auto"  # "auto" (the node daemon if one serves this cache), "daemon" or "embedded"
    socket: Path | None = None  # the node daemon's socket (None: its default path)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mountpoint", Path(self.mountpoint).expanduser().absolute())
        # Absolute, so a background mount and the node daemon agree on where the blobs are.
        object.__setattr__(self, "cache", replace(self.cache, directory=self.cache.directory.absolute()))


def check_fuse(device: str = FUSE_DEVICE) -> None:
    """Raise a clear :class:`MountError` if FUSE cannot work on this machine.

    Raises:
        MountError: pyfuse3 or libfuse3 missing, no FUSE device, no ``fusermount3`` for a non-root user.
    """
    try:
        import pyfuse3  # noqa: F401
    except ImportError as exc:
        raise MountError(f"the FUSE mount needs pyfuse3 and libfuse3 ({exc}): install the fuse3 package "
                         "(apt-get install fuse3 libfuse3-dev) and pip install 'stager[fuse]'") from exc
    if not os.path.exists(device):
        raise MountError(f"{device} is missing: load the fuse kernel module (modprobe fuse), or run the "
                         "container with --device /dev/fuse --cap-add SYS_ADMIN")
    if os.getuid() != 0:
        if shutil.which("fusermount3") is None:
            raise MountError("fusermount3 is not installed (it comes with the fuse3 package: apt-get install fuse3)")
        if not os.access(device, os.R_OK | os.W_OK):
            raise MountError(f"{device} is not readable and writable by this user")


def check_mountpoint(path: Path) -> Path:
    """The mount point, if it is a directory nothing is mounted on.

    Raises:
        MountError: missing, not a directory, or already a mount point.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise MountError(f"mount point {path} does not exist (create the directory first)") from None
    except OSError as exc:
        raise MountError(f"mount point {path}: {exc.strerror}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise MountError(f"mount point {path} is not a directory")
    if os.path.ismount(path):
        raise MountError(f"{path} is already a mount point (stager unmount {path} first)")
    return path


def _unescape(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def _mount_entry(mountpoint: Path) -> tuple[str, str, str] | None:
    """(``major:minor``, file system type, source) of what is mounted at ``mountpoint`` (the top one),
    from /proc/self/mountinfo: no stat, which would go through FUSE."""
    target = str(mountpoint)
    found = None
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 4 and _unescape(fields[4]) == target and " - " in line:
                    fstype, source = line.split(" - ", 1)[1].split()[:2]
                    found = (fields[2], fstype, _unescape(source))  # the last one listed is on top
    except OSError:
        return None
    return found


def mount_pid(mountpoint: Path) -> int | None:
    """The pid of the process serving the stager mount at ``mountpoint``; None if it is not one."""
    entry = _mount_entry(Path(mountpoint).expanduser().absolute())
    if entry is None or entry[1] != f"fuse.{FSNAME}" or not entry[2].startswith(f"{FSNAME}:"):
        return None
    try:
        return int(entry[2].split(":", 1)[1])
    except ValueError:
        return None


def tune_kernel_readahead(mountpoint: Path, kb: int) -> bool:
    """Set the kernel read-ahead of this mount (root only; best effort). True if set."""
    entry = _mount_entry(mountpoint)
    if entry is None or kb <= 0:
        return False
    device = entry[0]
    try:
        Path(f"/sys/class/bdi/{device}/read_ahead_kb").write_text(str(kb))
        return True
    except OSError as exc:
        log.info("kernel read-ahead of %s left at its default (%s)", mountpoint, exc.strerror)
        return False


async def serve(config: MountConfig, on_ready: Callable[[], None] | None = None) -> None:
    """Mount ``config.source`` at ``config.mountpoint`` and serve until unmounted or signalled.

    ``on_ready`` is called once the mount is usable.

    Raises:
        MountError: FUSE cannot work here, or the mount point is unusable.
        ManifestError: the source has no valid manifest, or its paths cannot form a tree.
        OriginError: the origin cannot be read (loading the manifest).
        CacheError: the cache directory cannot be used.
    """
    import pyfuse3
    import pyfuse3.asyncio

    from .operations import StagerOperations
    from .reader import CacheReader

    check_fuse()
    mountpoint = check_mountpoint(config.mountpoint)
    pyfuse3.asyncio.enable()
    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:  # closed in reverse: unmount first, the session last
        session = await loop.run_in_executor(None, functools.partial(  # blocking: a probe, or opening the cache
            open_session, config.cache, config.fetch, socket=config.socket, mode=config.session))
        stack.push_async_callback(session.close)
        # Our own view of the cache, to read what the session stages (the session reconciled the directory).
        cache = await loop.run_in_executor(None, lambda: CacheTier(config.cache, reconcile=False))
        stack.callback(cache.close)
        executor = ThreadPoolExecutor(max_workers=config.read_threads, thread_name_prefix="stager-mount")
        stack.callback(executor.shutdown, wait=True)
        dataset = await session.open_dataset(config.source)
        tree = await loop.run_in_executor(None, lambda: Tree.from_manifest(dataset.manifest, name=dataset.url))
        reader = CacheReader(session, dataset, cache, executor)
        stack.callback(reader.close)
        readahead = ReadAhead(session, dataset, tree.order, tree.positions, config.readahead)
        stack.push_async_callback(readahead.close)

        def ready() -> None:  # runs just after the kernel's FUSE handshake
            tune_kernel_readahead(mountpoint, config.kernel_readahead_kb)
            log.info("mounted %s at %s: %d files in %d directories; staging through %s", dataset.url, mountpoint,
                     tree.files, tree.directories,
                     "the node daemon" if getattr(session, "mode", "embedded") == "daemon" else "an engine here")
            if on_ready is not None:
                on_ready()

        ops = StagerOperations(tree, reader, readahead, timeout=config.timeout,
                               on_init=lambda: loop.call_soon(ready))
        # The pid in the mount's source lets `stager unmount` wait for this process.
        options = {f"fsname={FSNAME}:{os.getpid()}", f"subtype={FSNAME}", "ro", "noatime"}
        if config.default_permissions:
            options.add("default_permissions")
        if config.allow_other:
            options.add("allow_other")
        try:
            pyfuse3.init(ops, str(mountpoint), options)
        except RuntimeError as exc:
            raise MountError(f"cannot mount at {mountpoint}: {exc} (libfuse's reason is logged above)") from exc
        stack.callback(_unmounted, mountpoint)
        stack.callback(pyfuse3.close, unmount=True)

        def stop(signum: int) -> None:
            log.info("%s: unmounting %s", signal.Signals(signum).name, mountpoint)
            ops.shutdown()
            pyfuse3.terminate()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop, signum)
            stack.callback(loop.remove_signal_handler, signum)
        readahead.start()
        try:
            await pyfuse3.main(min_tasks=4, max_tasks=config.max_requests)
        finally:
            ops.shutdown()


def _unmounted(mountpoint: Path) -> None:
    log.info("unmounted %s", mountpoint)


# -- in the background ----------------------------------------------------------------------------


def mount_in_background(config: MountConfig, log_file: Path, *, timeout: float = READY_TIMEOUT) -> int:
    """Start a mount in a process of its own; return its pid once the mount is ready.

    The child (``python -m stager.fuse``) gets the config on stdin, writes its log to
    ``log_file``, and reports readiness (or its error) on a pipe.

    Raises:
        MountError, or the child's own error as a StagerError: the mount did not come up.
    """
    check_fuse()
    check_mountpoint(config.mountpoint)
    read_end, write_end = os.pipe()
    try:
        with open(log_file, "ab") as log_fh:
            child = subprocess.Popen(
                [sys.executable, "-m", "stager.fuse", str(write_end), str(min(logging.INFO, logging.getLogger().level))],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=log_fh, pass_fds=(write_end,), start_new_session=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
        os.close(write_end)
        write_end = -1
        assert child.stdin is not None
        child.stdin.write(pickle.dumps(config))
        child.stdin.close()
        message = _read_report(read_end, timeout)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    if message == "ready":
        return child.pid
    if child.poll() is None:
        child.kill()
    child.wait(10)
    if message is None:
        raise MountError(f"the mount process did not report within {timeout:.0f}s (log: {log_file})")
    if not message:
        raise MountError(f"the mount process exited with status {child.returncode} before the mount was ready "
                         f"(log: {log_file})")
    raise StagerError(message)


def _read_report(fd: int, timeout: float) -> str | None:
    """The child's one line: "ready", an error, "" if it exited without one, None on timeout."""
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace").strip()


def background_main(report_fd: int, log_level: int = logging.INFO) -> int:
    """The mount process started by :func:`mount_in_background` (``python -m stager.fuse FD [LOG_LEVEL]``)."""
    from stager.event_loop import run_async

    config: MountConfig = pickle.loads(sys.stdin.buffer.read())
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    reported = False

    def report(line: str) -> None:
        nonlocal reported
        if not reported:
            reported = True
            os.write(report_fd, line.replace("\n", " ").encode() + b"\n")
            os.close(report_fd)

    try:
        run_async(serve(config, on_ready=lambda: report("ready")))
    except StagerError as exc:
        log.error("%s", exc)
        report(str(exc))
        return 1
    except BaseException as exc:
        log.exception("the mount failed")
        report(f"the mount failed: {exc!r}")
        return 1
    return 0


# -- unmounting -----------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"  # a zombie has finished
    except OSError:
        return False


def unmount(mountpoint: Path, *, lazy: bool = False, timeout: float = EXIT_TIMEOUT) -> None:
    """Unmount a stager mount and wait (up to ``timeout`` s) for its process to finish.

    Raises:
        MountError: nothing is mounted there, or the unmount failed (e.g. busy: files are open;
            ``lazy`` detaches it now and finishes when they are closed).
    """
    path = Path(mountpoint).expanduser().absolute()
    if not os.path.ismount(path):
        raise MountError(f"{path} is not a mount point")
    pid = mount_pid(path)
    if shutil.which("fusermount3"):
        command = ["fusermount3", "-u"] + (["-z"] if lazy else []) + [str(path)]
    else:
        command = ["umount"] + (["-l"] if lazy else []) + [str(path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise MountError(f"cannot unmount {path}: {detail[-1] if detail else f'{command[0]} failed'}"
                         + ("" if lazy else " (files still open? --lazy detaches it now)"))
    if pid is None:
        return
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            raise MountError(f"{path} is unmounted, but its process {pid} is still running after {timeout:.0f}s")
        time.sleep(0.05)
