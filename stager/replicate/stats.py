"""What a replication did, counted as it goes (one event loop: plain increments, no locks)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ReplicateStats:
    """Live counters of one run; the progress bar reads them, the summary reports them."""

    objects_done: int = 0  # copied, checked or found in place during this run
    bytes_done: int = 0  # bytes of those (progress towards the plan's work)
    copied_objects: int = 0
    copied_bytes: int = 0  # bytes uploaded to the destination (parts included)
    resumed_bytes: int = 0  # parts a killed run had written, not sent again
    checked_objects: int = 0  # destination copies read and hashed
    checked_bytes: int = 0
    check_mismatches: int = 0  # of those, how many differed and were copied again
    corrupt_blocks: int = 0  # source blocks that failed their digest (retried, never written)
    deleted_objects: int = 0
    deleted_bytes: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)  # the first few, for the summary

    def fail(self, message: str) -> None:
        self.failed += 1
        if len(self.errors) < 10:
            self.errors.append(message)
