"""RetryPolicy: what is retried, how long it waits, how it gives up, and that cancellation wins."""

from __future__ import annotations

import asyncio

import pytest

from stager.config import RetryConfig
from stager.errors import (
    AccessDenied,
    CorruptData,
    OriginChanged,
    OriginError,
    OriginUnavailable,
    ShardNotFound,
    Throttled,
    TransientOriginError,
)
from stager.store.base import InvalidRange
from stager.store.retry import THROTTLE_FACTOR, RetryPolicy
from stager.store.stats import OriginStats


class FakeTime:
    """A clock that only moves when the policy sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        self.now += delay


def make_policy(t: FakeTime, *, rand: float = 1.0, **cfg: float) -> RetryPolicy:
    config = RetryConfig(**{"attempts": 5, "backoff_base": 0.1, "backoff_max": 10.0, "deadline": 100.0, **cfg})
    return RetryPolicy(config, stats=OriginStats(), sleep=t.sleep, random=lambda: rand, clock=t.clock)


def failing(*errors: BaseException, result: object = "ok"):
    """An op that raises ``errors`` in turn, then returns ``result``; counts its calls."""
    calls = []

    async def op():
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return result

    return op, calls


async def test_success_first_time():
    t = FakeTime()
    policy = make_policy(t)
    op, calls = failing()
    assert await policy.run(op, what="x") == "ok"
    assert len(calls) == 1 and t.sleeps == []
    assert policy.stats.ok == 1 and policy.stats.retries == 0


async def test_transient_errors_are_retried_with_exponential_backoff():
    t = FakeTime()
    policy = make_policy(t, rand=1.0)
    op, calls = failing(TransientOriginError("a"), TransientOriginError("b"), TransientOriginError("c"))
    assert await policy.run(op, what="x") == "ok"
    assert len(calls) == 4
    assert t.sleeps == pytest.approx([0.1, 0.2, 0.4])
    s = policy.stats
    assert (s.transient, s.ok, s.retries, s.gave_up) == (3, 1, 3, 0)


async def test_full_jitter_scales_the_delay():
    t = FakeTime()
    policy = make_policy(t, rand=0.5)
    op, _ = failing(TransientOriginError("a"), TransientOriginError("b"))
    await policy.run(op, what="x")
    assert t.sleeps == pytest.approx([0.05, 0.1])


async def test_backoff_is_capped():
    t = FakeTime()
    policy = make_policy(t, backoff_max=0.25, attempts=6)
    op, _ = failing(*[TransientOriginError(str(i)) for i in range(5)])
    await policy.run(op, what="x")
    assert t.sleeps == pytest.approx([0.1, 0.2, 0.25, 0.25, 0.25])


async def test_throttling_backs_off_longer_and_honours_retry_after():
    t = FakeTime()
    policy = make_policy(t)
    slow = Throttled("503 SlowDown")
    told = Throttled("429")
    told.retry_after = 3.0
    op, _ = failing(slow, told)
    await policy.run(op, what="x")
    assert t.sleeps[0] == pytest.approx(0.1 * THROTTLE_FACTOR)
    assert t.sleeps[1] == pytest.approx(3.0)
    assert policy.stats.throttled == 2


async def test_timeouts_inside_an_attempt_are_transient():
    t = FakeTime()
    policy = make_policy(t)
    op, calls = failing(TimeoutError())
    assert await policy.run(op, what="x") == "ok"
    assert len(calls) == 2 and policy.stats.transient == 1


@pytest.mark.parametrize("error", [ShardNotFound("gone"), AccessDenied("no"), InvalidRange("past end"), OriginError("400")])
async def test_permanent_errors_are_not_retried(error):
    t = FakeTime()
    policy = make_policy(t)
    op, calls = failing(error)
    with pytest.raises(type(error)) as info:
        await policy.run(op, what="x")
    assert info.value is error
    assert len(calls) == 1 and t.sleeps == [] and policy.stats.retries == 0


async def test_bugs_propagate_unchanged():
    t = FakeTime()
    policy = make_policy(t)
    op, calls = failing(KeyError("bug"))
    with pytest.raises(KeyError):
        await policy.run(op, what="x")
    assert len(calls) == 1


async def test_gives_up_after_attempts_naming_what_and_the_last_error():
    t = FakeTime()
    policy = make_policy(t, attempts=3)
    errors = [TransientOriginError("reset 1"), TransientOriginError("reset 2"), TransientOriginError("HTTP 500 last")]
    op, calls = failing(*errors)
    with pytest.raises(OriginUnavailable) as info:
        await policy.run(op, what="data/a.bin [0, 8)")
    err = info.value
    assert type(err) is OriginUnavailable
    assert "data/a.bin [0, 8)" in str(err) and "HTTP 500 last" in str(err) and "3 attempt" in str(err)
    assert err.__cause__ is errors[-1]
    assert len(calls) == 3 and len(t.sleeps) == 2
    assert policy.stats.gave_up == 1


async def test_corrupt_bodies_are_retried_then_reported_as_origin_changed():
    t = FakeTime()
    policy = make_policy(t, attempts=3)
    op, calls = failing(*[CorruptData(f"digest mismatch {i}") for i in range(3)])
    with pytest.raises(OriginChanged) as info:
        await policy.run(op, what="a.bin [0, 8)")
    assert "a.bin [0, 8)" in str(info.value)
    assert len(calls) == 3 and policy.stats.corrupt == 3


async def test_corrupt_then_good_succeeds():
    t = FakeTime()
    policy = make_policy(t)
    op, calls = failing(CorruptData("bad"), result=b"good")
    assert await policy.run(op, what="x") == b"good"


async def test_last_failure_decides_the_final_error():
    t = FakeTime()
    policy = make_policy(t, attempts=2)
    op, _ = failing(CorruptData("bad"), TransientOriginError("reset"))
    with pytest.raises(OriginUnavailable) as info:
        await policy.run(op, what="x")
    assert not isinstance(info.value, CorruptData)


async def test_origin_changed_from_inside_is_final():
    t = FakeTime()
    policy = make_policy(t)
    op, calls = failing(OriginChanged("nested"))
    with pytest.raises(OriginChanged):
        await policy.run(op, what="x")
    assert len(calls) == 1


async def test_deadline_stops_retrying_before_a_sleep_would_pass_it():
    t = FakeTime()
    policy = make_policy(t, attempts=100, deadline=1.0, backoff_base=0.3, backoff_max=0.3)
    op, calls = failing(*[TransientOriginError(str(i)) for i in range(100)])
    with pytest.raises(OriginUnavailable):
        await policy.run(op, what="x")
    assert t.now <= 1.0
    assert len(calls) == 4  # sleeps at 0.3, 0.6, 0.9; a fourth would end past 1.0


async def test_each_attempt_has_a_timeout():
    config = RetryConfig(attempts=3, backoff_base=0.001, backoff_max=0.001, deadline=5.0, request_timeout=0.05)
    policy = RetryPolicy(config)
    calls = []

    async def hangs():
        calls.append(1)
        await asyncio.sleep(10)

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(OriginUnavailable) as info:
        await policy.run(hangs, what="slow.bin")
    assert loop.time() - started < 2.0
    assert len(calls) == 3
    assert "no answer within" in str(info.value)


async def test_deadline_bounds_the_attempt_timeout():
    config = RetryConfig(attempts=10, backoff_base=0.001, backoff_max=0.001, deadline=0.2, request_timeout=60.0)
    policy = RetryPolicy(config)

    async def hangs():
        await asyncio.sleep(10)

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(OriginUnavailable):
        await policy.run(hangs, what="slow.bin")
    assert loop.time() - started < 1.0


async def test_cancellation_during_an_attempt_propagates_at_once():
    policy = RetryPolicy(RetryConfig(attempts=5, backoff_base=0.001))
    started = asyncio.Event()
    calls = []

    async def hangs():
        calls.append(1)
        started.set()
        await asyncio.sleep(10)

    task = asyncio.create_task(policy.run(hangs, what="x"))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(calls) == 1


async def test_cancellation_during_backoff_propagates_at_once():
    sleeping = asyncio.Event()

    async def sleep(delay: float) -> None:
        sleeping.set()
        await asyncio.sleep(10)

    policy = RetryPolicy(RetryConfig(attempts=5), sleep=sleep)
    op, calls = failing(*[TransientOriginError(str(i)) for i in range(5)])
    task = asyncio.create_task(policy.run(op, what="x"))
    await asyncio.wait_for(sleeping.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(calls) == 1


async def test_stats_count_requests_by_outcome():
    t = FakeTime()
    stats = OriginStats()
    policy = RetryPolicy(RetryConfig(attempts=5), stats=stats, sleep=t.sleep, random=lambda: 0.0, clock=t.clock)
    op, _ = failing(Throttled("s"), TransientOriginError("t"), CorruptData("c"))
    await policy.run(op, what="x")
    op, _ = failing(ShardNotFound("n"))
    with pytest.raises(ShardNotFound):
        await policy.run(op, what="y")
    op, _ = failing(AccessDenied("d"))
    with pytest.raises(AccessDenied):
        await policy.run(op, what="z")
    assert stats.snapshot() | {} == {
        **stats.snapshot(),
        "ok": 1, "throttled": 1, "transient": 1, "corrupt": 1, "not_found": 1, "denied": 1, "retries": 3,
    }
    assert stats.requests == 6


async def test_concurrency_limit_and_queueing_is_not_a_timeout():
    config = RetryConfig(attempts=1, deadline=30.0, request_timeout=0.3)
    policy = RetryPolicy(config, concurrency=2)
    in_flight = 0
    peak = 0

    async def op():
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.1)
        in_flight -= 1
        return 1

    # 8 ops of 0.1 s through 2 slots take 0.4 s: longer than the 0.3 s timeout, yet none times out
    assert sum(await asyncio.gather(*(policy.run(op, what=str(i)) for i in range(8)))) == 8
    assert peak == 2


async def test_an_attempt_cut_short_by_the_deadline_does_not_hide_the_error_before_it():
    """A refusal, then an attempt that only had the deadline's last sliver: the error that says what is
    wrong is the refusal, not "no answer within 0.0008s" (seen under load with a short deadline)."""
    config = RetryConfig(attempts=10, backoff_base=0.05, backoff_max=0.05, deadline=0.3, request_timeout=60.0)
    policy = RetryPolicy(config, random=lambda: 1.0)
    calls = []

    async def refused_then_hangs():
        calls.append(1)
        if len(calls) == 1:
            raise TransientOriginError("data.bin: connection refused")
        await asyncio.sleep(10)  # the next attempts hang until the deadline cuts them

    with pytest.raises(OriginUnavailable) as info:
        await asyncio.wait_for(policy.run(refused_then_hangs, what="data.bin"), 10)
    assert "connection refused" in str(info.value)
    assert "no answer" not in str(info.value)
