"""How far ahead of its consumer a plan stages: seconds of the consumer's measured rate, within bounds.

A plan used to stage every blob inside its byte window (2 GiB by default) ahead
of the cursor, whatever the consumer's pace: a job reading 1.6 MB/s of tokens
had the whole of a 1 GiB corpus fetched to consume 49 MB before it stopped. A
plan now stages what its consumer will read in the next ``seconds``, from its
measured rate, between two bounds:

- the **floor**, what the consumer must find complete to never stall (the
  iterator's current and next shuffle window: its shard planner passes them
  in bytes), staged whatever the rate;
- the **cap**, the byte window, which stays the limit the cache's size sets.

So ``ahead = floor + rate x seconds``, clamped to the cap. Before the rate is
known (a cold start: the cursor has not moved yet) the plan stages the floor
and :data:`FIRST_GUESS_BYTES` more. A consumer that names no floor gets its
whole window as one (``stage``, the mount's streams and a checkpoint restore
never advance, or size their window by their own reads; a consumer of an
earlier version says nothing): time bounds only the plans that ask for it.

The rate (:class:`ConsumptionRate`) is the bytes of the order the cursor
passes per second of the clock, smoothed. It rises quickly (a consumer that
speeds up gets its window within seconds) and falls slowly, never below half
its value in one step: a consumer that pauses (a checkpoint, an evaluation)
does not collapse its window to the floor at once, and while it pauses nothing
is measured at all (only the cursor's moves are). Over-staging a little costs
bytes; under-staging costs stalls, which the floor alone must not be left to
prevent.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

from ..config import DEFAULT_AHEAD_SECONDS, MiB

__all__ = ["DEFAULT_AHEAD_SECONDS", "FIRST_GUESS_BYTES", "ConsumptionRate", "ReadAhead"]

#: Staged past the floor before the consumer's rate is known: two shards of 32 MiB, enough to keep
#: requests flowing past the floor while the first window is read, small beside any byte window.
FIRST_GUESS_BYTES = 64 * MiB
#: Time constants (seconds) of the smoothed rate going up and going down.
RISE_SECONDS = 10.0
FALL_SECONDS = 120.0
#: One measurement lowers the rate by at most this factor.
MOST_FALL = 0.5
#: Moves of the cursor closer together than this are measured together (a rate over microseconds is noise).
MIN_INTERVAL = 1.0


class ConsumptionRate:
    """A consumer's rate in bytes per second from the moves of its cursor, smoothed.

    ``clock`` is the time base (``time.monotonic``; tests pass their own). The first interval
    starts when the estimator is made, with the plan.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since = clock()
        self._pending = 0  # bytes passed since ``_since``, not yet measured
        self.rate: float | None = None  # None until the first interval of MIN_INTERVAL has passed
        self.observations = 0

    def passed(self, nbytes: int) -> None:
        """The cursor has just passed ``nbytes`` more bytes of the order."""
        self._pending += max(0, int(nbytes))
        now = self._clock()
        elapsed = now - self._since
        if elapsed < MIN_INTERVAL:
            return
        measured = self._pending / elapsed
        self._since, self._pending = now, 0
        self.observations += 1
        if self.rate is None:
            self.rate = measured
            return
        tau = RISE_SECONDS if measured > self.rate else FALL_SECONDS
        smoothed = self.rate + (1.0 - math.exp(-elapsed / tau)) * (measured - self.rate)
        self.rate = max(smoothed, self.rate * MOST_FALL)


@dataclass(frozen=True, slots=True)
class ReadAhead:
    """A plan's bounds on staging ahead: ``seconds`` of its rate past ``floor_bytes``, at most ``cap_bytes``;
    ``first_guess_bytes`` past the floor while the rate is not known.

    Raises:
        ValueError: a bound that is not positive (the floor may be 0), or not finite seconds.
    """

    cap_bytes: int
    floor_bytes: int = 0
    seconds: float = DEFAULT_AHEAD_SECONDS
    first_guess_bytes: int = FIRST_GUESS_BYTES

    def __post_init__(self) -> None:
        if self.cap_bytes <= 0:
            raise ValueError(f"the read-ahead cap must be > 0 bytes, got {self.cap_bytes}")
        if self.floor_bytes < 0 or self.first_guess_bytes < 0:
            raise ValueError(f"the read-ahead floor and first guess must be >= 0 bytes, got {self.floor_bytes} "
                             f"and {self.first_guess_bytes}")
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"seconds ahead must be a finite number > 0, got {self.seconds}")
        # The cap wins: a floor larger than the cache allows is staged only as far as the cap.
        object.__setattr__(self, "floor_bytes", min(self.floor_bytes, self.cap_bytes))

    def bytes_for(self, rate: float | None) -> int:
        """Bytes to stage ahead of the cursor for a consumer reading ``rate`` bytes/s (None: not known yet)."""
        beyond = self.first_guess_bytes if rate is None else rate * self.seconds
        return int(min(self.cap_bytes, self.floor_bytes + beyond))
