"""Batches made ahead on a helper thread while the training loop computes.

Making a batch (copying its rows out of the mapped shards into a new array)
costs a fraction of a millisecond, and it is on the loop's critical path if
it happens inside ``next()``. `MadeAhead` lets a helper thread make up to
``depth`` batches while the consumer is away (a training step mostly runs
with the GIL released), so that ``next()`` only takes one that is ready.

Two costs shape it, both measured on the loop's path:

* The consumer never waits for an idle helper: when nothing is ready it
  makes the batch itself. The helper only works for a consumer that stays
  away between calls (on average at least `AWAY_MIN`): a loop that asks
  again at once (no compute between steps) makes its batches inline and
  never trades the GIL with the helper, which would cost more than a batch.
* The consumer never wakes the helper: waking a thread from ``next()`` cost
  up to half a millisecond (a futex, a context switch, on a VM an interrupt
  between CPUs). The helper wakes itself instead, on a timer paced by the
  consumer: about every ``depth / 2`` of the consumer's steps.

One lock lets one thread at a time advance the source, and whatever the
helper made is queued before the consumer can make the next one, so the
order is the source's, exactly. An error raised by the source reaches the
consumer in its place in the order.

A helper still running when the interpreter exits is stopped first (at
``atexit``): a loop that breaks out of its iteration leaves it alive, and a
daemon thread caught inside C++ code (a tensor being made) while the
interpreter finalizes is unwound by force, which aborts the process
("terminate called without an active exception").
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections import deque
from time import perf_counter as _clock
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")

AWAY_MIN = 0.001  # seconds the consumer spends between calls, on average, before the helper works for it
_AWAY_WEIGHT = 0.25  # weight of the newest gap in the running average
_NAP_MIN, _NAP_MAX = 0.001, 0.05  # bounds of the helper's sleep between looks at the queue
_JOIN_TIMEOUT = 10.0  # seconds close() waits for the helper thread to end once nothing is in the making
_END = object()  # what _advance() returns when the source is exhausted


class MadeAhead(Generic[T]):
    """Iterate ``source`` with up to ``depth`` items made ahead by a helper thread.

    Close it to stop the helper (the source is closed too); closing waits for
    an item in the making, then drops what is queued.
    """

    def __init__(self, source: Iterator[T], depth: int, name: str = "stager-made-ahead") -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._source = source
        self._depth = depth
        self._ready: deque[tuple[object, BaseException | None]] = deque()
        self._making = threading.Lock()  # held while the source is advanced
        self._stop = threading.Condition()  # the helper naps here; close() wakes it
        self._finished = False  # the source is exhausted (or raised): nothing more to make
        self._closed = False
        self._away = 0.0  # running average of the consumer's time between calls
        self._left_at: float | None = None
        self._helper = threading.Thread(target=self._run, name=name, daemon=True)
        _LIVE.add(self)
        self._helper.start()

    def __iter__(self) -> MadeAhead[T]:
        return self

    def __next__(self) -> T:
        # The path of every step: written out flat (no helper calls), it costs about 0.5 us.
        now = _clock()
        if self._left_at is not None:
            self._away += _AWAY_WEIGHT * (now - self._left_at - self._away)
        ready = self._ready
        if ready:  # only this thread takes: what is there stays there
            item, error = ready.popleft()
        else:
            making = self._making
            making.acquire()
            try:
                if ready:  # the helper finished one while we waited for the lock
                    item, error = ready.popleft()
                elif self._finished or self._closed:
                    raise StopIteration from None
                else:
                    item, error = self._advance()
                    if item is _END:
                        raise StopIteration from None
            finally:
                making.release()
        self._left_at = _clock()
        if error is not None:
            raise error
        return item  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the helper and close the source; waits for an item in the making. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if threading.current_thread() is self._helper:
            return  # (a collection run on the helper itself): it may hold _making; it stops on its own
        with self._stop:
            self._stop.notify_all()
        with self._making:  # after this, the helper never touches the source again
            self._ready.clear()
            close = getattr(self._source, "close", None)
            if close is not None:
                close()
        self._helper.join(_JOIN_TIMEOUT)

    # -- the helper -------------------------------------------------------------------------------

    def _advance(self) -> tuple[object, BaseException | None]:
        """The source's next item, or its error, or `_END` (caller holds ``_making``)."""
        try:
            return next(self._source), None
        except StopIteration:
            self._finished = True
            return _END, None
        except BaseException as exc:  # handed to the consumer in its place in the order
            self._finished = True
            return None, exc

    def _wanted(self) -> bool:
        return self._away >= AWAY_MIN and len(self._ready) < self._depth

    def _nap(self) -> float:
        """How long the helper sleeps before it looks again: about ``depth / 2`` of the consumer's steps."""
        if self._away < AWAY_MIN:
            return _NAP_MAX
        return min(_NAP_MAX, max(_NAP_MIN, self._away * max(1, self._depth // 2)))

    def _run(self) -> None:
        while not (self._closed or self._finished):
            if not self._wanted():
                with self._stop:
                    if not self._closed:
                        self._stop.wait(self._nap())
                continue
            with self._making:  # one item per hold: a consumer that finds the queue empty waits for one at most
                if self._closed or self._finished or not self._wanted():
                    continue
                item, error = self._advance()
                if item is not _END:
                    self._ready.append((item, error))


#: Every MadeAhead not yet collected: those still open are closed before the interpreter finalizes.
_LIVE: "weakref.WeakSet[MadeAhead]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for made_ahead in list(_LIVE):
        made_ahead.close()
