"""The value objects the cache tier hands out: a blob's state, its record, usage, reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class BlobState(IntEnum):
    """A blob's life cycle in the cache: ABSENT -> PARTIAL -> COMPLETE -> (evicted) ABSENT."""

    ABSENT = 0
    PARTIAL = 1  # a file under partial/ plus the set of blocks verified in it
    COMPLETE = 2  # a read-only file under blobs/, every block verified


@dataclass(frozen=True, slots=True)
class BlobRecord:
    """What the index knows about one blob."""

    digest: str
    state: BlobState
    size: int
    block_size: int
    block_count: int
    verified: frozenset[int]  # block indexes on disk and verified (all of them when COMPLETE)
    charged: int  # bytes counted against the capacity
    last_access: float  # seconds since the epoch
    consumed: str | None  # token of the last mark_consumed()
    pinned: bool


@dataclass(frozen=True, slots=True)
class CacheUsage:
    """How full the cache is; ``used`` counts complete blobs' disk blocks and partial blobs' reservations."""

    used: int
    capacity: int
    complete: int  # number of complete blobs
    partial: int  # number of partial blobs

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.used)


@dataclass(frozen=True, slots=True)
class DatasetSummary:
    """One registered dataset as ``stager status`` shows it."""

    name: str
    blobs: int
    bytes: int
    complete: int
    partial: int
    complete_bytes: int


@dataclass(frozen=True, slots=True)
class BadBlob:
    """A blob in which verify() found blocks that do not hash to their recorded digest."""

    digest: str
    state: BlobState
    bad_blocks: tuple[int, ...]
    reason: str = "digest mismatch"


@dataclass(frozen=True, slots=True)
class BlobCheck:
    """The result of re-hashing one blob."""

    blocks: int  # blocks checked
    bytes: int  # bytes read (0 when the file had the wrong size)
    bad: list[int]  # blocks that do not hash to their recorded digest


@dataclass(slots=True)
class VerifyReport:
    """What a scrub looked at and what it found (and dropped, when repairing)."""

    blobs_checked: int = 0
    blocks_checked: int = 0
    bytes_checked: int = 0
    bad: list[BadBlob] = field(default_factory=list)
    repaired: bool = False

    @property
    def ok(self) -> bool:
        return not self.bad

    def add(self, digest: str, state: BlobState, check: BlobCheck) -> None:
        self.blobs_checked += 1
        self.blocks_checked += check.blocks
        self.bytes_checked += check.bytes
        if check.bad:
            reason = "digest mismatch" if check.bytes else "wrong file size"
            self.bad.append(BadBlob(digest, state, tuple(check.bad), reason))
