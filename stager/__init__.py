"""stager: keeps LLM training fed on bad infrastructure.

Pre-stages tokenized shards from object storage into a node-local cache, ahead
of the training cursor and verified with xxhash, and serves them to training.

``stager.TokenIterator`` (NumPy) and ``stager.torch.TokenDataset`` (PyTorch)
are the training-side entry points; the first is imported on first use, so
``import stager`` stays light (and never imports torch).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["TokenIterator", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "TokenIterator":
        from .iterator import TokenIterator

        return TokenIterator
    raise AttributeError(f"module 'stager' has no attribute {name!r}")
