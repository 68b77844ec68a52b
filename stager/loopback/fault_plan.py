"""What the fault proxy does to each request: the plan and the seeded decider.

How it works: a `FaultPlan` is a plain mutable dataclass of probabilities and
settings; tests change it at runtime (through `FaultProxy.update` or by
assigning a field). For every request that matches the plan's filters (method,
path substring, path regex) the `FaultDecider` takes exactly four draws from
its own ``random.Random(seed)``, whatever the plan says, so the same seed and
the same request order give the same fault sequence:

1. jitter: ``delay = latency_s + jitter_s * u``;
2. spike: an extra ``spike_s`` of delay with probability ``spike_p``;
3. the one "exclusive" fault, from one uniform draw over the cumulative
   probabilities in this order: slowdown (503 SlowDown), error500, reset,
   truncate, flip, ignore_range (their sum must be <= 1);
4. position: where in the body a reset / truncation / flipped byte happens,
   as a fraction of the body length.

Two more behaviours make the proxy act like an object store rather than a
loopback server, and take no draws: ``connection_bps`` caps each response (and
each request body) on its own, as a real store caps each connection, while
``bandwidth_bps`` caps all of them together; ``rate_limit_rps`` is a request
rate per key prefix above which requests are answered ``503 SlowDown`` (see
rate_limit.py; counted as ``rate_limit``, never towards ``max_faults``).

Spikes and exclusive faults count towards ``max_faults``; once it is reached no
more are drawn (latency, jitter and the bandwidth cap still apply, and ``down``
always does). A fault that turns out not to apply (no Range header to ignore,
an empty or non-2xx body to cut) is refunded. Everything is guarded by one lock.
"""

from __future__ import annotations

import collections
import enum
import random
import re
import threading
from dataclasses import dataclass, field, replace

DOWN_MODES = ("503", "reset", "refuse")
_EVENT_LIMIT = 100_000


class Fault(enum.StrEnum):
    """Kinds of injected faults (the keys of the proxy's fault counters)."""

    SPIKE = "spike"
    SLOWDOWN = "slowdown"  # 503 with an S3 SlowDown XML body
    ERROR_500 = "error500"  # 500 with an S3 InternalError XML body
    RESET = "reset"  # part of the body, then TCP RST
    TRUNCATE = "truncate"  # part of the body, then clean close (FIN)
    FLIP = "flip"  # one body byte XOR 0xFF
    IGNORE_RANGE = "ignore_range"  # Range dropped: 200 with the whole object
    RATE_LIMIT = "rate_limit"  # over plan.rate_limit_rps on its prefix: 503 SlowDown
    DOWN = "down"  # plan.down: 503, reset or refused connection


EXCLUSIVE = (
    Fault.SLOWDOWN,
    Fault.ERROR_500,
    Fault.RESET,
    Fault.TRUNCATE,
    Fault.FLIP,
    Fault.IGNORE_RANGE,
)


@dataclass
class FaultPlan:
    """Per-request fault settings; mutable, validated on every use.

    Probabilities are per matching request. ``bandwidth_bps`` caps the bytes/s
    of all matching transfers together, ``connection_bps`` those of each one
    (None: no cap). ``rate_limit_rps`` admits that many matching requests per
    second on each key prefix (bursts of ``rate_limit_burst``, default a tenth
    of a second's worth) and answers the rest ``503 SlowDown``. ``down`` answers every
    request (matching or not) according to ``down_mode``: "503" (SlowDown),
    "reset" (TCP RST, no response) or "refuse" (listener closed: ECONNREFUSED;
    needs `FaultProxy.update`/`set_down` to take and lift). ``methods`` None
    means every method.
    """

    latency_s: float = 0.0
    jitter_s: float = 0.0
    spike_p: float = 0.0
    spike_s: float = 1.0
    slowdown_p: float = 0.0
    error500_p: float = 0.0
    reset_p: float = 0.0
    truncate_p: float = 0.0
    flip_p: float = 0.0
    ignore_range_p: float = 0.0
    bandwidth_bps: float | None = None
    connection_bps: float | None = None
    rate_limit_rps: float | None = None
    rate_limit_burst: float | None = None
    down: bool = False
    down_mode: str = "503"
    methods: tuple[str, ...] | None = ("GET",)
    path_contains: str | None = None
    path_regex: str | None = None
    max_faults: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def probability(self, fault: Fault) -> float:
        return float(getattr(self, f"{fault.value}_p"))

    def validate(self) -> None:
        """Raise ValueError if the plan is inconsistent."""
        for name in ("latency_s", "jitter_s", "spike_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        probs = [self.spike_p] + [self.probability(f) for f in EXCLUSIVE]
        if any(not 0.0 <= p <= 1.0 for p in probs):
            raise ValueError("probabilities must be within [0, 1]")
        if sum(self.probability(f) for f in EXCLUSIVE) > 1.0 + 1e-9:
            raise ValueError("exclusive fault probabilities must sum to <= 1")
        for name in ("bandwidth_bps", "connection_bps", "rate_limit_rps", "rate_limit_burst"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 or None")
        if self.down_mode not in DOWN_MODES:
            raise ValueError(f"down_mode must be one of {DOWN_MODES}")
        if self.max_faults is not None and self.max_faults < 0:
            raise ValueError("max_faults must be >= 0 or None")
        if self.path_regex is not None:
            re.compile(self.path_regex)

    def matches(self, method: str, path: str) -> bool:
        """Whether faults and shaping apply to this request."""
        if self.methods is not None and method.upper() not in {m.upper() for m in self.methods}:
            return False
        if self.path_contains is not None and self.path_contains not in path:
            return False
        if self.path_regex is not None and re.search(self.path_regex, path) is None:
            return False
        return True

    def copy(self, **changes: object) -> FaultPlan:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Decision:
    """What happens to one matching request."""

    seq: int
    delay_s: float
    spike: bool
    fault: Fault | None
    position: float


@dataclass(frozen=True, slots=True)
class FaultEvent:
    """One matching request and the faults actually injected into it."""

    seq: int
    method: str
    path: str
    faults: tuple[Fault, ...]


@dataclass
class _State:
    seq: int = 0
    injected: int = 0
    counts: collections.Counter = field(default_factory=collections.Counter)
    events: dict[int, FaultEvent] = field(default_factory=dict)


class FaultDecider:
    """Seeded, thread-safe source of `Decision`s and fault counters."""

    def __init__(self, seed: int = 0) -> None:
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._state = _State()

    def reseed(self, seed: int) -> None:
        """Restart the random sequence and clear all counters and events."""
        with self._lock:
            self._rng = random.Random(seed)
            self._state = _State()

    def decide(self, plan: FaultPlan, method: str, path: str) -> Decision:
        """Draw the decision for one request that matches ``plan``."""
        with self._lock:
            u_jitter, u_spike, u_kind, u_pos = (self._rng.random() for _ in range(4))
            state = self._state
            seq = state.seq
            state.seq += 1

            def take(kind: Fault) -> bool:
                if plan.max_faults is not None and state.injected >= plan.max_faults:
                    return False
                state.injected += 1
                state.counts[kind] += 1
                return True

            spike = u_spike < plan.spike_p and take(Fault.SPIKE)
            fault = None
            edge = 0.0
            for kind in EXCLUSIVE:
                edge += plan.probability(kind)
                if u_kind < edge:
                    fault = kind if take(kind) else None
                    break
            kinds = tuple(k for k in ((Fault.SPIKE if spike else None), fault) if k)
            self._add_event(FaultEvent(seq, method, path, kinds))
            delay = plan.latency_s + plan.jitter_s * u_jitter + (plan.spike_s if spike else 0.0)
            return Decision(seq, delay, spike, fault, u_pos)

    def refund(self, decision: Decision) -> None:
        """Undo the exclusive fault of ``decision``: it could not be applied."""
        if decision.fault is None:
            return
        with self._lock:
            state = self._state
            state.injected -= 1
            state.counts[decision.fault] -= 1
            event = state.events.get(decision.seq)
            if event is not None:
                kinds = tuple(k for k in event.faults if k != decision.fault)
                state.events[decision.seq] = replace(event, faults=kinds)

    def record_down(self) -> None:
        self.record(Fault.DOWN)

    def record(self, kind: Fault) -> None:
        """Count a fault that was not drawn (down, rate limit): it never counts towards ``max_faults``."""
        with self._lock:
            self._state.counts[kind] += 1

    def _add_event(self, event: FaultEvent) -> None:
        events = self._state.events
        events[event.seq] = event
        if len(events) > _EVENT_LIMIT:
            del events[next(iter(events))]

    @property
    def counts(self) -> dict[str, int]:
        """Injected faults by kind (only kinds seen at least once)."""
        with self._lock:
            return {str(k): v for k, v in self._state.counts.items() if v}

    @property
    def injected(self) -> int:
        with self._lock:
            return self._state.injected

    @property
    def events(self) -> list[FaultEvent]:
        with self._lock:
            return list(self._state.events.values())
