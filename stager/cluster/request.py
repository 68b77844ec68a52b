"""What one peer asks another for: a block-aligned range of a blob, with what the holder needs to judge it.

Only blobs are addressable, by digest; never a path. Beside the range, a
request carries the blob's manifest coordinates (size, block size, its
index in the asker's manifest) and the asker's *dataset identity*: an
HMAC under a key derived from the cluster secret of the dataset's URL and
storage options (``identity.py``'s access identity, keyed for the cluster),
plus the manifest's fingerprint. Never a credential. The holder uses the
identity only to decide whether it may fetch the blob from the origin for
the asker (``holdings.py``). The ``mode`` says what the asker wants:

- ``hold``: only blocks the holder has verified now (an owner asking the
  nodes that owned a blob before a membership change);
- ``relay``: also blocks it is fetching for itself (a node asking its parent
  in the blob's spreading tree);
- ``fetch``: also a fetch from the origin, once for everyone (asking the owner).

``urgent`` says a consumer of the asker is blocked on the range: the holder
sends it ahead of its other sends (``uplink.py``) and fetches it at a
consumer's priority.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError

MODES = ("hold", "relay", "fetch")
DATASET_HEADER = "X-Stager-Dataset"
MANIFEST_HEADER = "X-Stager-Manifest"
ASKER_HEADER = "X-Stager-Asker"
BLOBS_PATH = "/v1/blobs/"


@dataclass(frozen=True, slots=True)
class PeerRequest:
    """One ranged read of a blob from a peer."""

    digest: str
    start: int
    end: int
    size: int
    block_size: int
    index: int  # the shard's index in the manifest the fingerprint names
    dataset: str  # the cluster-keyed dataset identity ("" if the asker has none to offer)
    manifest: str  # the manifest fingerprint
    mode: str
    asker: str
    urgent: bool = False  # a consumer of the asker waits for it now

    def context(self) -> str:
        """Everything besides method, digest and range that the signature covers."""
        fields = (self.dataset, self.manifest, str(self.index), str(self.size), str(self.block_size), self.mode,
                  self.asker)
        return "\n".join((*fields, "urgent") if self.urgent else fields)  # not urgent: signed as before

    def query(self) -> dict[str, str]:
        return {"start": str(self.start), "end": str(self.end), "size": str(self.size),
                "block_size": str(self.block_size), "index": str(self.index), "mode": self.mode,
                "urgent": "1" if self.urgent else "0"}

    def headers(self) -> dict[str, str]:
        return {DATASET_HEADER: self.dataset, MANIFEST_HEADER: self.manifest, ASKER_HEADER: self.asker}

    @property
    def blocks(self) -> range:
        """The block indexes the range covers."""
        return range(self.start // self.block_size, -(-self.end // self.block_size))

    @classmethod
    def parse(cls, digest: str, query: Mapping[str, str], headers: Mapping[str, str]) -> "PeerRequest":
        """The request as received (checked for shape only; the signature is checked by the caller).

        Raises:
            ConfigError: a missing or malformed field, an unknown mode, or a range that is not
                block-aligned inside the blob.
        """
        if len(digest) != 32 or any(c not in "0123456789abcdef" for c in digest):
            raise ConfigError("the digest is not 32 hex digits")
        try:
            start, end, size, block_size, index = (int(query[k]) for k in
                                                   ("start", "end", "size", "block_size", "index"))
        except (KeyError, ValueError):
            raise ConfigError("start, end, size, block_size and index must be whole numbers") from None
        mode = query.get("mode", "")
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}")
        urgent = query.get("urgent", "0")
        if urgent not in ("0", "1"):
            raise ConfigError("urgent must be 0 or 1")
        if block_size <= 0 or index < 0 or not 0 <= start < end <= size or start % block_size \
                or (end % block_size and end != size):
            raise ConfigError("the range must be non-empty, block-aligned and inside the blob")
        return cls(digest, start, end, size, block_size, index, headers.get(DATASET_HEADER, ""),
                   headers.get(MANIFEST_HEADER, ""), mode, headers.get(ASKER_HEADER, ""), urgent == "1")
