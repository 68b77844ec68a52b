"""The manifest's seal: an xxh3-128 digest of the whole file, kept inside the file itself.

How it works: the Parquet footer's key-value metadata holds one entry,
``stager.manifest_digest = "xxh3-128:" + 32 hex digits``. The writer puts 32
zeros there, writes the file, hashes every byte of it, and overwrites the
zeros with the digest: same length, so the Thrift footer stays valid and any
Parquet reader still opens the file. A reader finds the entry in the raw bytes,
hashes the file with the zeros put back, and compares, all *before* handing a
single byte to the Parquet parser: a flipped byte anywhere (data pages, footer,
footer length, magic, the digest itself) is caught without trusting any of the
structure it may have damaged.

One self-contained object rather than a sidecar digest file: the manifest is
written last and atomically (replication and the shard writer rely on it), and
a second object could be out of step with it.

A manifest without the entry is a legacy one (format version 1, written before
the seal). So that one flipped byte can never make a sealed manifest pass for a
legacy one, the entry carries two markers, its key and the ``xxh3-128:`` tag of
its value, bytes apart: a file is legacy only if neither appears. (The format
version, 2 for sealed manifests, is a third, checked after parsing.)
"""

from __future__ import annotations

import xxhash

from ..errors import ManifestError

DIGEST_KEY = b"stager.manifest_digest"
DIGEST_TAG = b"xxh3-128:"
_HEX_LEN = 32
PLACEHOLDER = b"0" * _HEX_LEN
#: The value written before sealing.
UNSEALED_VALUE = DIGEST_TAG + PLACEHOLDER
# Thrift compact encoding of a KeyValue puts the key, then two bytes (field header,
# value length), then the value: the key ends this close before the tag when intact.
_KEY_TO_TAG = 8


def seal(raw: bytes) -> bytes:
    """Return the Parquet bytes ``raw`` (written with :data:`UNSEALED_VALUE`) with their digest in place."""
    at = _value_at(raw)
    if at is None or raw[at : at + _HEX_LEN] != PLACEHOLDER:
        raise AssertionError("the manifest's digest placeholder is not where the writer put it")  # a bug, not input
    digest = _digest(raw, at).encode()
    return raw[:at] + digest + raw[at + _HEX_LEN :]


def check_seal(data: bytes | memoryview, name: str) -> bool:
    """Verify the seal of manifest bytes ``data`` read from ``name``, before parsing them.

    Returns:
        True if the bytes carry a digest and match it; False if they carry no trace
        of one (a legacy manifest, which only the structural checks can judge).

    Raises:
        ManifestError: the digest entry is damaged, or the bytes do not match it.
    """
    raw = data if isinstance(data, bytes) else bytes(data)
    at = _value_at(raw)
    if at is None:
        if raw.find(DIGEST_KEY) >= 0 or raw.find(DIGEST_TAG) >= 0:
            raise ManifestError(f"{name}: the manifest's digest entry is damaged (corrupt or truncated manifest)")
        return False
    stored = raw[at : at + _HEX_LEN]
    actual = _digest(raw, at)
    if stored != actual.encode():
        shown = stored.decode("ascii", "replace").encode("unicode_escape").decode()
        raise ManifestError(f"{name}: digest mismatch: the manifest's {len(raw):,} bytes hash to xxh3-128 {actual}, "
                            f"its digest entry says {shown} (corrupt manifest)")
    return True


def _value_at(raw: bytes) -> int | None:
    """Offset of the 32 hex digits of the digest entry, or None if the entry is not (wholly) there."""
    # The last tag: the footer's key-value metadata follows the row groups, whose statistics
    # may quote a path that happens to contain the tag.
    tag = raw.rfind(DIGEST_TAG)
    if tag < 0:
        return None
    key = raw.rfind(DIGEST_KEY, max(0, tag - len(DIGEST_KEY) - _KEY_TO_TAG), tag)
    at = tag + len(DIGEST_TAG)
    if key < 0 or at + _HEX_LEN > len(raw):
        return None
    return at


def _digest(raw: bytes, at: int) -> str:
    """xxh3-128 (hex) of ``raw`` with the placeholder in place of the 32 bytes at ``at``."""
    h = xxhash.xxh3_128()
    view = memoryview(raw)
    h.update(view[:at])
    h.update(PLACEHOLDER)
    h.update(view[at + _HEX_LEN :])
    return h.hexdigest()
