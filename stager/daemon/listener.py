"""Owning the daemon's Unix socket: one daemon per socket, and only the right users in.

Ownership is an exclusive ``flock`` on ``SOCKET.lock`` held for the daemon's
whole life (the kernel drops it when the process dies, even by SIGKILL). A
second daemon on the same socket cannot take it and refuses to start, naming
the pid written in the lock file. Holding the lock, a socket file left by a
daemon that died is stale and replaced; a path that is not a socket, or a
socket some other program answers on, is refused rather than taken over.

Permissions: the socket is bound inside a fresh private (0700) directory next
to its final path, given its mode there (0600: the daemon's user only; 0660
with ``socket_group``: that group too) and its group, and only then renamed
into place. So it is never reachable with looser permissions, whatever the
umask, and the rename also replaces a stale socket atomically. A parent
directory the daemon creates is 0700 (0750 and the group with
``socket_group``); ``connect`` needs write permission on the socket, so
other users are kept out even where the directory is world-readable.
"""

from __future__ import annotations

import errno
import fcntl
import grp
import logging
import os
import socket
import stat
import tempfile
from pathlib import Path

from ..errors import ConfigError, DaemonError

log = logging.getLogger(__name__)

BACKLOG = 1024


def answers(path: Path, timeout: float = 1.0) -> bool:
    """Whether some process accepts connections on the Unix socket at ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout)
    try:
        probe.connect(str(path))
        return True
    except (ConnectionRefusedError, FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:  # EACCES and the like: someone is there, and it is not ours to take
        return exc.errno not in (errno.ENOENT, errno.ECONNREFUSED)
    finally:
        probe.close()


class SocketOwner:
    """Takes the socket's lock, then binds it with the right permissions; releases both on stop."""

    def __init__(self, path: Path, group: str | None = None) -> None:
        self.path = Path(path).absolute()
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.gid = _group_id(group) if group else None
        self.mode = 0o660 if group else 0o600
        self._lock_fd: int | None = None
        self._inode: int | None = None

    def acquire(self) -> None:
        """Become the socket's only daemon.

        Raises:
            DaemonError: another daemon holds the socket, or a live process answers on it.
            ConfigError: the path exists and is not a socket, or its directory cannot be used.
        """
        self._prepare_dir()
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, self.mode)
        except OSError as exc:
            raise ConfigError(f"{self.lock_path}: cannot open the daemon's lock file: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise DaemonError(f"another stager daemon{f' (pid {holder})' if holder else ''} is already serving "
                              f"{self.path}; stop it first, or give this one another --socket") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd
        try:
            self._check_existing()
        except BaseException:
            self.release()
            raise

    def _prepare_dir(self) -> None:
        parent = self.path.parent
        if parent.is_dir():
            private_default = parent.name.startswith("stager-") and parent.parent == Path("/tmp")
            if private_default and parent.stat().st_uid != os.getuid():
                raise ConfigError(f"{parent} belongs to another user; give the daemon another --socket")
            return
        try:
            parent.mkdir(mode=0o750 if self.gid is not None else 0o700, parents=True)
            if self.gid is not None:
                os.chown(parent, -1, self.gid)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ConfigError(f"{parent}: cannot create the socket's directory: {exc.strerror}") from exc

    def _check_existing(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(f"{self.path} exists and is not a socket; refusing to replace it")
        if answers(self.path):
            raise DaemonError(f"{self.path} is already served by a live process that does not hold "
                              f"{self.lock_path}; refusing to start")
        log.info("replacing the stale socket %s left by a daemon that died", self.path)

    def bind(self) -> socket.socket:
        """A listening socket at the path, with the owner's mode and group (see the module doc).

        Raises:
            ConfigError: it cannot be created or given its permissions.
        """
        assert self._lock_fd is not None, "acquire() first"
        private = Path(tempfile.mkdtemp(prefix=".", dir=self.path.parent))
        temporary = private / "s"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(temporary))
            os.chmod(temporary, self.mode)
            if self.gid is not None:
                os.chown(temporary, -1, self.gid)
            sock.listen(BACKLOG)
            os.rename(temporary, self.path)
            self._inode = os.stat(self.path).st_ino
        except OSError as exc:
            sock.close()
            raise ConfigError(f"{self.path}: cannot create the daemon's socket: {exc.strerror or exc}") from exc
        finally:
            try:
                temporary.unlink(missing_ok=True)
                private.rmdir()
            except OSError:
                pass
        sock.setblocking(False)
        return sock

    def release(self) -> None:
        """Remove the socket (if it is still ours) and drop the lock. Idempotent."""
        if self._inode is not None:
            try:
                if os.lstat(self.path).st_ino == self._inode:
                    os.unlink(self.path)
            except FileNotFoundError:
                pass
            self._inode = None
        if self._lock_fd is not None:
            # The lock file stays: unlinking it would let two daemons lock two different files.
            os.close(self._lock_fd)
            self._lock_fd = None


def _group_id(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        if name.isdigit():
            return int(name)
        raise ConfigError(f"--socket-group: there is no group named {name!r}") from None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None
