"""The token iterator: fixed-length samples of a staged dataset, in a resumable order.

How it works. The manifest's token counts cut every token shard into samples
of ``seq_len`` tokens (:mod:`.samples`); all shards' samples form one global
index space. Each epoch is a permutation of it that depends only on
``(seed, epoch)`` (:mod:`.order`): the shards are shuffled and grouped into
small windows, and samples are shuffled within a window, so staging reads
the dataset a window at a time, nearly sequentially. Ranks and DataLoader
workers take disjoint chunks of the epoch in the order a training loop
consumes them (:mod:`.deal`), so the state of the stream (:mod:`.state`) is
a position in the epoch plus each worker's progress, and resuming on
another world size re-deals exactly what was not read.

Each consumer hands its exact future shard order to a session as a plan
(:mod:`.staging`; an engine embedded in the process, or the node daemon),
reads only complete, verified cache files through one reader per format
(:mod:`.readers`), and tells the plan when a window of shards is done, so a
cache smaller than the dataset streams through. Sync code drives the async
session through a loop thread (:mod:`.loop_thread`) made lazily in each
process, so DataLoader workers never share one.

:class:`TokenIterator` is the NumPy stream; ``stager.torch.TokenDataset``
wraps it as a PyTorch ``IterableDataset``, whose DataLoader workers swap the
parts of a saved loader state they were each handed once as they start
(:mod:`.exchange`), so any of them can re-deal from the whole.
"""

from .config import IteratorConfig
from .iterator import TokenIterator
from .order import EpochOrder, OrderSpec
from .samples import SampleIndex, SampleSpec
from .state import StreamState

__all__ = ["EpochOrder", "IteratorConfig", "OrderSpec", "SampleIndex", "SampleSpec", "StreamState", "TokenIterator"]
