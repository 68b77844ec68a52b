"""Where things live inside a cache directory, and the format version file.

::

    CACHE/
      stager-cache.toml          format = "stager-cache", version = 1 (written once, atomically)
      index.sqlite (-wal, -shm)  the blob index (see blob_index.py)
      index.reserve              room kept for the index on a full disk (see reserve.py)
      blobs/ab/abcdef...         complete blobs, read-only, one directory per first digest byte
                                 (made by the first commit that needs it)
      partial/<digest>.<gen>     partial blobs: files of the blob's full size, allocated up front
                                 where the file system can (sparse elsewhere)
      locks/blobs.ranges         the blobs' cross-process locks: one byte each (see locks.py)
      locks/<digest>.lock        per-blob flock files where a file system refuses those,
                                 unlinked by their holder on release

The generation suffix of a partial file is random and also recorded in the
index row, so an index that points at a partial file can never be fooled by a
newer file of the same digest (an evicted and re-begun blob).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..diskio import fsync_dir
from ..errors import CacheError

FORMAT_NAME = "stager-cache"
FORMAT_VERSION = 1
FORMAT_FILE = "stager-cache.toml"
INDEX_FILE = "index.sqlite"

_HEX = "0123456789abcdef"  # str.strip(_HEX) leaves nothing of a hex string: a fast, strict check
# Entries a fresh directory may already hold (a file system's root on a dedicated disk).
_IGNORABLE = {"lost+found"}
SHARD_DIRS = tuple(f"{i:02x}" for i in range(256))


def check_digest(digest: str) -> str:
    """Return ``digest`` if it is a blob digest (32 lowercase hex characters).

    Raises:
        ValueError: it is not.
    """
    if type(digest) is not str or len(digest) != 32 or digest.strip(_HEX):
        raise ValueError(f"not a blob digest (32 lowercase hex characters): {digest!r}")
    return digest


def check_digests(digests: Iterable[str]) -> None:
    """Check many digests at C speed (a million in well under a second).

    Raises:
        ValueError: one of them is not a blob digest (named).
    """
    digests = list(digests)
    try:
        joined = "".join(digests)
    except TypeError:
        joined = None
    if joined is None or set(map(len, digests)) - {32} or joined.strip(_HEX):
        for digest in digests:
            check_digest(digest)


def new_generation() -> str:
    """A fresh random generation tag for a partial file (16 hex characters)."""
    return os.urandom(8).hex()


@dataclass(frozen=True, slots=True)
class CacheLayout:
    """The paths of one cache directory."""

    root: Path

    @property
    def format_path(self) -> Path:
        return self.root / FORMAT_FILE

    @property
    def index_path(self) -> Path:
        return self.root / INDEX_FILE

    @property
    def blobs_dir(self) -> Path:
        return self.root / "blobs"

    @property
    def partial_dir(self) -> Path:
        return self.root / "partial"

    @property
    def locks_dir(self) -> Path:
        return self.root / "locks"

    def complete_path(self, digest: str) -> Path:
        return self.root / "blobs" / digest[:2] / digest

    def partial_path(self, digest: str, gen: str) -> Path:
        return self.root / "partial" / f"{digest}.{gen}"

    def lock_path(self, digest: str) -> Path:
        return self.root / "locks" / f"{digest}.lock"


def open_layout(root: Path) -> CacheLayout:
    """Create the cache directory (or check an existing one) and return its layout.

    A new directory gets the format file first, written to a temporary name
    and linked into place, so concurrent creators agree on one file.

    Raises:
        CacheError: the directory cannot be created, is not empty and not a
            cache, or holds a cache of an unknown format version.
    """
    layout = CacheLayout(Path(root))
    try:
        layout.root.mkdir(parents=True, exist_ok=True)
        if not layout.format_path.exists():
            _create_format_file(layout)
        _check_format_file(layout)
        for sub in (layout.partial_dir, layout.locks_dir, layout.blobs_dir):
            sub.mkdir(exist_ok=True)
    except CacheError:
        raise
    except OSError as exc:
        raise CacheError(f"{layout.root}: cannot set up the cache directory: {exc.strerror or exc}") from exc
    return layout


def _create_format_file(layout: CacheLayout) -> None:
    temp_prefix = f".{FORMAT_FILE}."
    names = os.listdir(layout.root)
    if FORMAT_FILE in names:
        return  # another process created the cache meanwhile
    others = [n for n in names if n not in _IGNORABLE and not n.startswith(temp_prefix)]
    if others:
        raise CacheError(f"{layout.root}: not a stager cache (no {FORMAT_FILE}) and not empty; "
                         "refusing to use it, choose an empty or new directory")
    temp = layout.root / f"{temp_prefix}{os.getpid()}.{os.urandom(4).hex()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, f'format = "{FORMAT_NAME}"\nversion = {FORMAT_VERSION}\n'.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temp, layout.format_path)
    except (FileExistsError, FileNotFoundError):
        pass  # another creator won (and may have swept our temp away): its file is as good
    try:
        os.unlink(temp)
    except FileNotFoundError:
        pass
    fsync_dir(layout.root)


def _check_format_file(layout: CacheLayout) -> None:
    path = layout.format_path
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise CacheError(f"{layout.root}: unreadable cache format file {FORMAT_FILE}: {exc}") from exc
    if data.get("format") != FORMAT_NAME:
        raise CacheError(f"{layout.root}: {FORMAT_FILE} does not describe a stager cache "
                         f"(format = {data.get('format')!r})")
    version = data.get("version")
    if version != FORMAT_VERSION:
        raise CacheError(f"{layout.root}: cache format version {version!r} is not supported by this stager "
                         f"(it knows version {FORMAT_VERSION}); use a matching stager or another cache directory")


def remove_stray_format_temps(layout: CacheLayout) -> int:
    """Remove temporary format files left by a creator that died; returns how many."""
    removed = 0
    for name in os.listdir(layout.root):
        if name.startswith(f".{FORMAT_FILE}."):
            try:
                os.unlink(layout.root / name)
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def make_shard_dir(layout: CacheLayout, digest: str) -> None:
    """Create the ``blobs/xx/`` directory of ``digest`` if it is missing.

    Made on first use: a new cache would otherwise start with 256 mkdirs, a
    tenth of a second on some disks, before its first byte. It is not fsynced
    on its own: the commit fsyncs the directory after its rename, which on
    journalling file systems (ext4, xfs) makes the directory's creation durable
    too. Where it does not, a power loss can lose the directory, and the next
    start-up's reconcile drops the rows of the blobs it held (fetched again).
    """
    shard = layout.complete_path(digest).parent
    if not shard.is_dir():
        shard.mkdir(exist_ok=True)


