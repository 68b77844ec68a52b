"""An iterator left to the garbage collector closes its staging link without waiting for it.

The collector runs an object's finalizer on whatever thread happens to allocate, inside whatever lock
that thread holds. Seen in the suite: a stager loop thread inside ``ThreadPoolExecutor.submit``, which
holds the executors' global lock, collected an iterator whose finalizer then waited for its own link to
close, and closing a link hands work to an executor, which needs that lock: every loop thread of the
process hung behind it.
"""

import threading
import time
from concurrent.futures import thread as executor_threads

from stager.iterator import TokenIterator
from tests.iterator.corpus import write_counting_corpus


def test_a_collected_iterator_on_a_thread_holding_the_executors_lock_starts_its_close_and_returns(tmp_path):
    write_counting_corpus(tmp_path / "data", [4096] * 4)
    it = TokenIterator(str(tmp_path / "data"), seq_len=64, seed=1, shuffle_window=2, cache_dir=tmp_path / "cache",
                       capacity=1 << 30, log_every=0, session="embedded")
    next(iter(it))  # the link and its loop are up, a plan runs
    link, finalizer = it._link, it._finalizer
    returned = threading.Event()

    def collected_here() -> None:
        with executor_threads._global_shutdown_lock:  # as inside ThreadPoolExecutor.submit
            finalizer()  # what the collector calls
            returned.set()

    threading.Thread(target=collected_here, daemon=True).start()
    assert returned.wait(5), "the finalizer waited for a close that needs the lock it was called under"
    deadline = time.monotonic() + 20
    while link.usable and time.monotonic() < deadline:  # the close goes on once the lock is free
        time.sleep(0.02)
    assert not link.usable, "the link's loop still runs: the close was not started"
