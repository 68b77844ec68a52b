"""The store interface: what the engine, the cache and replication may ask of an origin.

A :class:`Store` is rooted at one URL and addresses objects by a relative,
``/``-separated path. The async methods are the truth; there is no sync API.
Every implementation retries through :class:`~stager.store.retry.RetryPolicy`
and raises only :class:`~stager.errors.OriginError` subclasses.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Awaitable, Callable, Mapping

from ..aio import to_the_end
from ..errors import InvalidPath, InvalidRange, OriginError, ShardNotFound, UnsupportedOperation
from ..paths import BAD_PATH_PROBLEM, is_safe_path
from .held import holding

if TYPE_CHECKING:
    from .bandwidth import BandwidthLimiter
    from .retry import RetryPolicy
    from .stats import OriginStats

#: ``check(data)`` verifies a body before it is returned; it raises
#: :class:`~stager.errors.CorruptData` to have the read retried. It may be a
#: coroutine function (awaited within the attempt).
Check = Callable[[bytes], "None | Awaitable[None]"]


async def run_check(check: Check | None, data: bytes) -> None:
    """Apply ``check`` to ``data``, awaiting it if it is a coroutine function."""
    if check is not None:
        result = check(data)
        if result is not None:
            await result


class RangeSink(abc.ABC):
    """Takes the bytes of one attempt at a range, in order, as they arrive (see :meth:`Store.read_range_into`).

    A new sink is opened for every attempt. :meth:`close` ends a complete
    attempt and may raise :class:`~stager.errors.CorruptData` (the read is then
    retried with a new sink); :meth:`abort` ends an attempt that failed, was cut
    short or was cancelled, and is always awaited to its end.
    """

    @abc.abstractmethod
    async def write(self, chunk: bytes) -> None:
        """The next bytes of the range (a reference the sink may keep: they are not reused)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Every byte of the range was written: finish (and verify) them."""

    @abc.abstractmethod
    async def abort(self) -> None:
        """The attempt failed: settle whatever is in progress; the bytes written count for nothing."""

    def receive_into(self) -> memoryview | None:
        """Memory of the sink's own, as long as the range, that its bytes may be received straight into.

        A sink that copies what it is given into memory of its own may offer
        it: an HTTP store then receives the body there, without a buffer of
        its own or a copy, and :meth:`write` is given views of that memory
        at their place (a sink can tell them by ``chunk.obj``). None (the
        default): bytes arrive in the store's buffers.
        """
        return None


async def feed_sink(sink: RangeSink, chunks: AsyncIterator[bytes]) -> None:
    """Write ``chunks`` into ``sink`` and close it; on any failure or cancellation, abort it first."""
    try:
        async for chunk in chunks:
            await sink.write(chunk)
        await sink.close()
    except BaseException:
        await to_the_end(sink.abort())
        raise


async def _one_chunk(data: bytes) -> AsyncIterator[bytes]:
    yield data


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object of a store: its path relative to the root, its size, its mtime (epoch seconds) if known.

    ``md5`` (lowercase hex) is the MD5 of the object's bytes where the origin vouches for it
    (S3's ETag of a single-part object, GCS's md5Hash, Azure's Content-MD5), else None. It
    describes the object, not its listing, so it takes no part in comparisons.
    """

    path: str
    size: int
    mtime: float | None = None
    md5: str | None = field(default=None, compare=False)


def split_protocol(url: str) -> tuple[str | None, str]:
    """``"s3://bucket/key"`` -> ``("s3", "bucket/key")``; a URL without ``PROTO://`` -> ``(None, url)``.

    As fsspec splits them (a one-letter protocol is a Windows drive), without importing fsspec.
    """
    url = str(url)
    protocol, sep, rest = url.partition("://")
    if sep and len(protocol) > 1:
        return protocol, rest
    return None, url


def validate_path(path: str) -> str:
    """Return ``path`` if it is a safe relative object path, else raise :class:`InvalidPath`.

    Safe is the one rule of :mod:`stager.paths`, which the manifest's validation applies too.
    """
    if not is_safe_path(path):
        raise InvalidPath(f"{path!r}: {BAD_PATH_PROBLEM}")
    return path


def validate_range(path: str, start: int, end: int) -> None:
    """Raise :class:`InvalidRange` unless ``0 <= start <= end``."""
    if not (isinstance(start, int) and isinstance(end, int)) or start < 0 or end < start:
        raise InvalidRange(f"{path}: invalid byte range [{start}, {end})")


class Upload(abc.ABC):
    """A large object written in numbered parts, made visible only by :meth:`complete`.

    Parts are numbered from 1. Every part but the last holds exactly the
    ``part_size`` given to :meth:`Store.open_upload`; the last may be shorter.
    Parts may be written in any order and concurrently, and a part may be
    written again (the last write wins). Until :meth:`complete` returns,
    nothing is visible at the destination; :meth:`abort` discards it all.
    """

    @abc.abstractmethod
    async def write_part(self, part_number: int, data: bytes) -> None:
        """Store one part.

        Raises:
            ValueError: bad part number or a part of the wrong size.
            OriginError: the origin refused it or stayed unavailable.
        """

    @abc.abstractmethod
    async def complete(self) -> None:
        """Make the object visible atomically, made of parts 1..N.

        Raises:
            ValueError: parts missing (not contiguous from 1).
            OriginError: the origin refused it or stayed unavailable.
        """

    @abc.abstractmethod
    async def abort(self) -> None:
        """Discard every part written so far. Safe to call more than once."""

    @property
    def token(self) -> str | None:
        """An opaque string for :meth:`Store.resume_upload` to continue this upload later,
        from this process or another one on the same machine; None if it cannot be resumed."""
        return None

    async def __aenter__(self) -> Upload:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        # Abort on error; the caller completes explicitly on success.
        if exc_type is not None:
            await self.abort()


class Store(abc.ABC):
    """An origin rooted at :attr:`url`. See the package docstring for the contract.

    Implementations set :attr:`stats`, :attr:`retry` and :attr:`bandwidth` (see
    :meth:`~stager.store.options.StoreOptions.machinery`); the helpers below use them.
    """

    stats: "OriginStats"
    retry: "RetryPolicy"
    bandwidth: "BandwidthLimiter | None" = None

    async def _pace(self, nbytes: int) -> None:
        """Wait for the bandwidth cap to allow ``nbytes`` more (at once without a cap)."""
        if self.bandwidth is not None:
            await self.bandwidth.acquire(nbytes)

    async def _read_range_by(self, path: str, start: int, end: int, check: Check | None,
                             get: Callable[[str], Awaitable[bytes]]) -> bytes:
        """A ranged read as the remote stores do it: the range validated; an empty one still fails
        on a missing object; else, under the retry policy and the bandwidth cap, ``get(what)`` (one
        attempt's exact bytes, ``what`` naming the range in errors) and ``check``."""
        validate_range(path, start, end)
        if start == end:
            await self.info(path)
            await run_check(check, b"")
            return b""
        what = f"{path} [{start}, {end})"

        async def attempt() -> bytes:
            await self._pace(end - start)
            data = await get(what)
            await run_check(check, data)
            return data

        return await self.retry.run(attempt, what=what)

    async def _read_counted(self, what: str, read: Callable[[], Awaitable[bytes]], check: Check | None = None) -> bytes:
        """``read()`` under the retry policy, its errors translated, its bytes counted and ``check``-ed."""
        from .translate import translated  # translate.py names this module's errors: imported late

        async def attempt() -> bytes:
            with translated(what):
                data = await read()
            self.stats.bytes_read += len(data)
            await run_check(check, data)
            return data

        return await self.retry.run(attempt, what=what)

    @property
    def endpoint(self) -> str | None:
        """Where requests go when :attr:`url` does not say (an S3 endpoint), for messages; None if it does."""
        return None

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The root URL (``file:///abs/dir``, ``s3://bucket/prefix``, ``https://host/dir``)."""

    @abc.abstractmethod
    async def list(self) -> list[ObjectInfo]:
        """Every object below the root, recursively, sorted by path.

        Raises:
            UnsupportedOperation: the origin cannot list (plain HTTP).
            OriginError: listing failed.
        """

    async def scan(self) -> AsyncIterator[list[ObjectInfo]]:
        """Every object below the root, in pages in no particular order.

        For listings too large to hold at once (millions of objects): stores
        that can page their listing override this; the default yields
        :meth:`list` as one page.

        Raises:
            UnsupportedOperation, OriginError: as :meth:`list`.
        """
        yield await self.list()

    @abc.abstractmethod
    async def info(self, path: str) -> ObjectInfo:
        """Size and mtime of one object.

        Raises:
            ShardNotFound: no such object (or it is a directory).
            OriginError: any other failure, after retries.
        """

    @abc.abstractmethod
    async def read_range(self, path: str, start: int, end: int, *, check: Check | None = None) -> bytes:
        """Exactly the ``end - start`` bytes of ``[start, end)``.

        ``check(data)`` may raise :class:`~stager.errors.CorruptData`; the read
        is then retried within the same retry budget. A body of the wrong
        length is a :class:`~stager.errors.TransientOriginError`, retried too.

        Raises:
            InvalidRange: ``start > end``, negative, or ``end`` past the object's end.
            ShardNotFound, AccessDenied: at once, never retried.
            OriginUnavailable: transient failures outlasted the retry budget.
            OriginChanged: the last attempts all failed ``check``.
        """

    async def read_range_into(self, path: str, start: int, end: int, open_sink: Callable[[], RangeSink]) -> None:
        """Stream the bytes of ``[start, end)`` into ``open_sink()``, a new sink for each attempt.

        For ranges too large to hold in memory at once, or to write them to disk
        as they arrive. A sink whose :meth:`RangeSink.close` raises
        :class:`~stager.errors.CorruptData` has the read retried, like ``check``
        in :meth:`read_range`; any failure of an attempt aborts its sink first.
        Stores that cannot stream (the default here) give each attempt's body
        to its sink in one piece.

        Raises:
            As :meth:`read_range`; and whatever the sink raises other than CorruptData.
        """
        async def deliver(data: bytes) -> None:
            with holding(len(data)):
                await feed_sink(open_sink(), _one_chunk(data))

        await self.read_range(path, start, end, check=deliver)

    @abc.abstractmethod
    async def read(self, path: str, *, check: Check | None = None) -> bytes:
        """The whole object in one request (for small things such as manifests).

        ``check`` as in :meth:`read_range`: a body it refuses is read again within the retry budget.
        One request, not a size look-up and a ranged read: the bytes are of one version of the object
        even if it is rewritten meanwhile, and an origin far away is asked once, not twice.

        Raises like :meth:`read_range`.
        """

    @abc.abstractmethod
    async def write(self, path: str, data: bytes) -> None:
        """Write a whole object atomically: readers see the old bytes or the new, never a mix.

        Raises:
            UnsupportedOperation: read-only origin.
            OriginError: the write failed (after retries).
        """

    @abc.abstractmethod
    async def delete(self, path: str) -> None:
        """Delete one object. Deleting an absent object is not an error."""

    async def exists(self, path: str) -> bool:
        """Whether an object (not a directory) exists at ``path``."""
        try:
            await self.info(path)
        except ShardNotFound:
            return False
        return True

    @abc.abstractmethod
    async def open_upload(self, path: str, *, part_size: int) -> Upload:
        """Start a multipart write of a large object (see :class:`Upload`)."""

    async def resume_upload(self, path: str, *, part_size: int, token: str, parts: Mapping[int, int]) -> Upload:
        """Continue an upload from :meth:`open_upload`, maybe started by a process since killed.

        Args:
            path, part_size: as given to :meth:`open_upload`.
            token: the upload's :attr:`Upload.token`.
            parts: the parts known to be written (number -> size); others are written again.
                Stores that can list an upload's parts (S3) check them; the others trust them.

        Raises:
            ShardNotFound: the upload is gone (completed, aborted, expired), or the origin
                says it lacks one of ``parts``: start a new one.
            UnsupportedOperation: this store cannot resume uploads.
            OriginError: the origin failed (after retries).
        """
        raise UnsupportedOperation(f"{self.url}: this store cannot resume an upload")

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections and threads. The store must not be used afterwards."""

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
