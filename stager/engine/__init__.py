"""The staging engine: plans, single-flight blob fetches, priority, hedging.

Consumers describe what they will read as a :class:`Plan` (an ordered list of a
dataset's shards and a cursor). The :class:`Engine` fetches the blobs inside
each plan's window (:mod:`.read_ahead`: what its consumer reads in the next
minute at its measured rate, past a floor, within a byte window), nearest
first, as parallel verified block reads
through a :class:`PriorityGate`; a blob a consumer blocks on jumps the queue.
Each blob is fetched once however many plans want it (``BlobJob``, shared
through ``asyncio.shield``), and once across processes sharing a cache (the
cache's file lock). A blob's bytes come from its :mod:`.source` list (the origin
unless a peer stands before it). One blob's path from origin to cache: :mod:`.job`
(single flight, locks, commit), :mod:`.spans` (blocks into requests),
:mod:`.span_fetch` (a request from the sources, hedged), :mod:`.span_writer`
(its body into the partial file, verified block by block); the parts share a
:class:`~.context.FetchContext`, not the engine.
"""

from .dataset import BlobRef, Dataset
from .engine import Engine
from .gate import PriorityGate
from .hedging import LatencyTracker, hedged
from .plan import URGENT, Plan
from .source import BlobSource, BlobSources, OriginSource
from .stats import EngineStats

__all__ = ["URGENT", "BlobRef", "BlobSource", "BlobSources", "Dataset", "Engine", "EngineStats", "LatencyTracker",
           "OriginSource", "Plan", "PriorityGate", "hedged"]
