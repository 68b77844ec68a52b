"""Small generated corpora for engine tests (multi-block shards, small blocks)."""

from __future__ import annotations

from pathlib import Path

from stager.cache import BlobState, CacheTier
from stager.manifest import Manifest
from stager.write import generate_corpus

BLOCK = 64 * 1024


def make_corpus(root: Path, *, shards: int = 6, tokens: int = 160_000, seed: int = 0) -> Manifest:
    """About ``shards`` x 320 KB of uint16 tokens in 64 KiB blocks (5-6 blocks per shard)."""
    return generate_corpus(root, shards=shards, tokens_per_shard=tokens, seed=seed, block_size=BLOCK)


def assert_cache_matches(cache: CacheTier, manifest: Manifest, origin_root: Path) -> None:
    """Every shard is complete in the cache and byte-identical to the origin's file."""
    for entry in manifest:
        assert cache.state(entry.digest) is BlobState.COMPLETE, entry.path
        assert cache.complete_path(entry.digest).read_bytes() == (origin_root / entry.path).read_bytes(), entry.path
