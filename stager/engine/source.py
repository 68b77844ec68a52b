"""Where a blob's bytes come from: the blob-source seam (the origin today, a peer node beside it).

A :class:`BlobSource` reads a byte range of one blob, either streamed into a
sink per attempt (the contract of :meth:`~stager.store.Store.read_range_into`,
whose sink verifies each block against the manifest) or into memory (for the
hedge). :class:`BlobSources` names, for each blob, the sources to try, best
first; the last is always the origin (:class:`OriginSource`: the dataset's
store, exactly as the engine read it before sources existed). The engine
moves on for the blocks still unverified when one raises
:class:`~stager.errors.BlobSourceError`, times out, or sends bytes that fail
verification more than ``corrupt_budget`` times: it asks ``for_blob`` again
(a failure may have changed the answer) and takes the first source it has not
tried yet; the origin keeps its store's retry policy and errors.

While a source reads a span, :func:`request_priority` gives that span's gate
priority as it is now (it moves up, to ``URGENT`` and below, when a consumer
blocks on the span's blocks): a source that queues requests of its own (a
peer) orders them by it and tells the holder when a consumer waits.
"""

from __future__ import annotations

import abc
from contextvars import ContextVar
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from ..store import Check, RangeSink

if TYPE_CHECKING:
    from .dataset import BlobRef

ORIGIN = "origin"  # the kind of the origin source
PEER = "peer"  # the kind of every other source, unless it says otherwise

#: The priority of the span the current task's source read serves, read live (set by the engine per read).
_REQUEST_PRIORITY: ContextVar[Callable[[], float]] = ContextVar("stager_request_priority")


def _unknown_priority() -> float:
    return 0.0


def request_priority() -> Callable[[], float]:
    """The gate priority, read live, of the span the calling source's read serves (0.0 outside a read)."""
    return _REQUEST_PRIORITY.get(_unknown_priority)


def set_request_priority(priority: Callable[[], float]) -> object:
    """Set what :func:`request_priority` answers in the calling task; the token undoes it
    (:func:`reset_request_priority`)."""
    return _REQUEST_PRIORITY.set(priority)


def reset_request_priority(token: object) -> None:
    _REQUEST_PRIORITY.reset(token)  # type: ignore[arg-type]


class BlobSource(abc.ABC):
    """One place the bytes of a blob's blocks can come from: the origin today, a peer node next."""

    name: str = PEER  # for stats and logs, e.g. "origin", "peer 127.0.0.2:7070"; one per place (a span
    # does not ask a source of the same name twice)
    kind: str = PEER  # what its bytes and failures are counted under (EngineStats)
    #: Attempts whose bytes fail verification that the engine lets pass before it skips the source.
    corrupt_budget: int = 1
    #: Seconds a read of a span may take before the engine skips the source; None: no limit of the engine's.
    timeout: float | None = None

    @abc.abstractmethod
    async def read_into(self, ref: "BlobRef", start: int, end: int, open_sink: Callable[[], RangeSink]) -> None:
        """Bytes [start, end) of blob `ref`, streamed into a new sink per attempt (the contract of
        Store.read_range_into: sink.close() may raise CorruptData, which fails the attempt)."""

    @abc.abstractmethod
    async def read(self, ref: "BlobRef", start: int, end: int, *, check: Check | None = None) -> bytes:
        """The same bytes in memory (used by the hedge)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class OriginSource(BlobSource):
    """The blob's own dataset store (``ref.dataset.store`` at ``ref.path``), under its retry policy."""

    name = ORIGIN
    kind = ORIGIN

    async def read_into(self, ref: "BlobRef", start: int, end: int, open_sink: Callable[[], RangeSink]) -> None:
        await ref.dataset.store.read_range_into(ref.path, start, end, open_sink)

    async def read(self, ref: "BlobRef", start: int, end: int, *, check: Check | None = None) -> bytes:
        return await ref.dataset.store.read_range(ref.path, start, end, check=check)


class BlobSources(Protocol):
    def for_blob(self, ref: "BlobRef") -> Sequence[BlobSource]:
        """The sources to try for this blob, best first; the last is always the origin."""

    # Optional: ``first_block(ref, span_blocks) -> int``, where in each request of ``span_blocks`` blocks a
    # whole-blob fetch starts (``first_block`` below; 0 when a source set does not say).


def first_block(sources: BlobSources, ref: "BlobRef", span_blocks: int) -> int:
    """The block, in ``[0, span_blocks)``, at which a whole-blob fetch of ``ref`` lays its first request.

    0 (the blob in order) unless ``sources`` staggers it: the children of one node in a cluster's spreading
    tree each start at a different point, so that their parent sends the first copies of a blob's blocks
    side by side, ahead of most second copies (``stager.cluster.peer_source``). The blocks before that
    point are fetched last.
    """
    stagger = getattr(sources, "first_block", None)
    if stagger is None or span_blocks <= 1:
        return 0
    return min(max(0, int(stagger(ref, span_blocks))), span_blocks - 1)


class OriginOnly:
    """Every blob from its origin alone (the engine's default)."""

    def __init__(self) -> None:
        self._sources = (OriginSource(),)

    def for_blob(self, ref: "BlobRef") -> Sequence[BlobSource]:
        return self._sources
