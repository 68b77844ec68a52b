"""The daemon's registry of consumers and their plans.

Each consumer (one process's session: a data loader worker, the mount, a
``stager stage``) has an id it chose and any number of named plans, each one
engine :class:`~stager.engine.Plan` (prefetching ahead of its cursor and
protecting its window from eviction). Registering a plan id again replaces
the plan: that is how a consumer moves to a new epoch, and how it re-registers
at its cursor after the daemon restarted (a new daemon starts empty).

A consumer that goes away must not pin prefetch windows for ever, so every
request renews its lease, clients send heartbeats, and the reaper drops a
consumer whose lease ran out, or at once when the process that registered it
(its pid from the socket's peer credentials, with start time and boot id) is
dead. A consumer whose plans were dropped gets :class:`UnknownPlan` on its
next request and registers them again.

A consumer is bound to the key it sent with its first request (see
``protocol.py``): only a digest of the key is kept, compared in constant
time, and a request naming the consumer with another key is refused with
:class:`ConsumerKeyMismatch` before it can see or touch a plan.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..cache.liveness import ProcessIdentity, boot_id, is_alive, process_start
from ..daemon_client.protocol import ConsumerKeyMismatch, UnknownPlan
from ..engine import Dataset, Engine, Plan

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RegisteredPlan:
    consumer: str
    id: str
    plan: Plan
    fingerprint: str
    registered: float


@dataclass(slots=True)
class ConsumerRecord:
    id: str
    identity: ProcessIdentity | None  # None when the peer's pid is not visible here
    last_seen: float
    key_digest: bytes  # SHA-256 of the consumer's key; the key itself is not kept
    plans: dict[str, RegisteredPlan] = field(default_factory=dict)


def identify(pid: int | None) -> ProcessIdentity | None:
    """The identity of a peer process, or None if its pid is unknown or not in our pid namespace."""
    if not pid or pid <= 0:
        return None
    start = process_start(pid)
    return None if start is None else ProcessIdentity(pid, start, boot_id())


class PlanRegistry:
    """Consumers by id, their plans by id, and the leases that keep them."""

    def __init__(self, engine: Engine, lease: float, *, clock: Callable[[], float] = time.monotonic,
                 alive: Callable[[ProcessIdentity], bool] = is_alive) -> None:
        self.engine = engine
        self.lease = lease
        self._clock = clock
        self._alive = alive
        self._consumers: dict[str, ConsumerRecord] = {}
        self.dropped_consumers = 0

    # -- consumers ------------------------------------------------------------------------------

    def seen(self, consumer_id: str, key: str, pid: int | None = None) -> ConsumerRecord:
        """Record a request from ``consumer_id`` with its ``key`` (creating it), renewing its lease.

        Raises:
            ConsumerKeyMismatch: the consumer is known with another key.
        """
        now = self._clock()
        record = self._consumers.get(consumer_id)
        if record is None:
            record = ConsumerRecord(consumer_id, identify(pid), now, _digest(key))
            self._consumers[consumer_id] = record
        else:
            _check(record, key)
        if pid and (record.identity is None or record.identity.pid != pid):
            record.identity = identify(pid)  # the same id from another process: follow the newest
        record.last_seen = now
        return record

    @property
    def consumers(self) -> list[ConsumerRecord]:
        return list(self._consumers.values())

    def plans(self) -> list[RegisteredPlan]:
        return [p for c in self._consumers.values() for p in c.plans.values()]

    async def drop(self, consumer_id: str, key: str | None = None) -> int:
        """Close every plan of a consumer and forget it; returns how many plans were closed.

        Raises:
            ConsumerKeyMismatch: ``key`` is given and is not the consumer's.
        """
        record = self._consumers.get(consumer_id)
        if record is None:
            return 0
        if key is not None:
            _check(record, key)
        del self._consumers[consumer_id]
        for registered in list(record.plans.values()):
            await registered.plan.close()
        return len(record.plans)

    # -- plans ----------------------------------------------------------------------------------

    async def register(self, consumer_id: str, key: str, plan_id: str, dataset: Dataset,
                       order: np.ndarray | None, *, fingerprint: str, cursor: int = 0,
                       window_bytes: int | None = None, name: str | None = None, pid: int | None = None,
                       floor_bytes: int | None = None, ahead_seconds: float | None = None) -> Plan:
        """Create (or replace) a consumer's plan, prefetching from ``cursor``.

        Raises:
            ConsumerKeyMismatch: the consumer is known with another key.
        """
        record = self.seen(consumer_id, key, pid)
        old = record.plans.pop(plan_id, None)
        if old is not None:
            await old.plan.close()
        label = f"{consumer_id}/{plan_id}" + (f" ({name})" if name else "")
        plan = self.engine.plan(dataset, order, window_bytes=window_bytes, name=label, start=False,
                                floor_bytes=floor_bytes, ahead_seconds=ahead_seconds)
        # A consumer coming back after a restart resumes at its cursor; the positions before it
        # were consumed already, so they are neither fetched nor protected.
        plan.cursor = min(cursor, len(plan))
        plan.start()
        if consumer_id not in self._consumers:  # dropped by the reaper meanwhile
            self._consumers[consumer_id] = record
        record.plans[plan_id] = RegisteredPlan(consumer_id, plan_id, plan, fingerprint, time.time())
        return plan

    def get(self, consumer_id: str, key: str, plan_id: str) -> RegisteredPlan:
        """A registered plan; renews the consumer's lease.

        Raises:
            UnknownPlan: no such consumer or plan here (register it again).
            ConsumerKeyMismatch: the consumer is known with another key.
        """
        record = self._consumers.get(consumer_id)
        if record is not None:
            _check(record, key)
        registered = record.plans.get(plan_id) if record is not None else None
        if registered is None:
            raise UnknownPlan(f"no plan {plan_id!r} of consumer {consumer_id!r} in this daemon "
                              "(it restarted, or the lease expired): register it again")
        record.last_seen = self._clock()
        return registered

    async def close(self, consumer_id: str, key: str, plan_id: str) -> bool:
        """Close one plan; whether there was one.

        Raises:
            ConsumerKeyMismatch: the consumer is known with another key.
        """
        record = self._consumers.get(consumer_id)
        if record is not None:
            _check(record, key)
        registered = record.plans.pop(plan_id, None) if record is not None else None
        if registered is None:
            return False
        await registered.plan.close()
        return True

    # -- leases ---------------------------------------------------------------------------------

    async def expire(self) -> list[str]:
        """Drop consumers whose process died or whose lease ran out; returns their ids."""
        now = self._clock()
        gone = [c.id for c in self._consumers.values()
                if now - c.last_seen > self.lease or (c.identity is not None and not self._alive(c.identity))]
        for consumer_id in gone:
            plans = await self.drop(consumer_id)
            self.dropped_consumers += 1
            log.info("consumer %s is gone (process ended or lease expired); dropped its %d plan(s)",
                     consumer_id, plans)
        return gone

    async def run_reaper(self, interval: float) -> None:
        """Expire consumers every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.expire()
            except Exception:  # noqa: BLE001 - the reaper must outlive one bad round
                log.exception("expiring consumers failed")

    async def close_all(self) -> None:
        for consumer_id in list(self._consumers):
            await self.drop(consumer_id)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _check(record: ConsumerRecord, key: str) -> None:
    if not hmac.compare_digest(record.key_digest, _digest(key)):
        raise ConsumerKeyMismatch(f"consumer {record.id!r} is another process's: the request does not carry "
                                  "its key")
