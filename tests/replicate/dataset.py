"""A small dataset with both kinds of objects (multipart-sized and small), and checks of a replica."""

from __future__ import annotations

import os
import random
from pathlib import Path

import xxhash

from stager.config import RetryConfig
from stager.hashing import StreamHasher
from stager.manifest import (
    MANIFEST_PATH,
    Manifest,
    ShardEntry,
    encode_manifest,
    read_manifest_file,
)
from stager.replicate.finalize import REPLICATE_DIR

MiB = 1 << 20
#: 1 MiB blocks: 5 blocks make the smallest part S3 accepts, so an object over 5 MiB is a multipart upload.
BLOCK = MiB
#: Quick retries so that fault tests stay fast; the deadline still bounds every request.
FAST_RETRY = RetryConfig(attempts=12, backoff_base=0.005, backoff_max=0.05, deadline=90.0, request_timeout=30.0)


def write_dataset(root: Path, files: dict[str, bytes], *, block_size: int = BLOCK) -> Manifest:
    """Write ``files`` under ``root`` and their manifest (non-token entries) at ``root/.stager``."""
    entries = []
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        hasher = StreamHasher(block_size)
        hasher.update(data)
        digest, blocks = hasher.finish()
        entries.append(ShardEntry(name, len(data), digest, tuple(blocks), None, None, None))
    manifest = Manifest.from_entries(entries, block_size)
    (root / MANIFEST_PATH).parent.mkdir(parents=True, exist_ok=True)
    (root / MANIFEST_PATH).write_bytes(encode_manifest(manifest))
    return manifest


def mixed_files(seed: int = 0, *, large: tuple[int, ...] = (6 * MiB + 12345, 5 * MiB + 7),
                small: int = 24) -> dict[str, bytes]:
    """Objects over 5 MiB (multipart), small ones in sub-folders, and an empty one."""
    rng = random.Random(seed)
    files = {f"large/big-{i}.bin": rng.randbytes(size) for i, size in enumerate(large)}
    for i in range(small):
        files[f"small/{i % 3}/part-{i:04d}.bin"] = rng.randbytes(rng.randint(1, 40_000))
    files["small/empty.bin"] = b""
    return files


def assert_replica(src_root: Path, dst_root: Path) -> None:
    """The destination has every object of the source manifest, byte for byte and digest for digest,
    its manifest is the source's (same bytes), and no done-marker is left behind."""
    src_manifest = (src_root / MANIFEST_PATH).read_bytes()
    assert (dst_root / MANIFEST_PATH).read_bytes() == src_manifest, "destination manifest differs from the source's"
    manifest = read_manifest_file(str(dst_root / MANIFEST_PATH))
    for entry in manifest:
        data = (dst_root / entry.path).read_bytes()
        assert len(data) == entry.size, entry.path
        assert xxhash.xxh3_128_hexdigest(data) == entry.digest, entry.path
        assert data == (src_root / entry.path).read_bytes(), entry.path
    markers = dst_root / REPLICATE_DIR
    assert not markers.exists() or not any(p.is_file() for p in markers.rglob("*")), "done-markers left behind"


def flags(side: str, options: dict) -> list[str]:
    """Storage options of a test S3 server as repeated ``-s``/``-d`` flags."""
    out: list[str] = []

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}{key}.", inner)
        else:
            out.extend([side, f"{prefix[:-1]}={value}"])

    walk("", options)
    return out


def corrupt_file(path: Path, offset: int = 0) -> None:
    """Flip one byte of a file in place (size unchanged)."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
        fh.flush()
        os.fsync(fh.fileno())
