"""The cluster-wide name of a dataset version: who may make another node fetch a blob for them.

On one node the daemon names a dataset by its *access identity* (URL and
every storage option, keyed by a random per-daemon key: ``identity.py``)
and the manifest's fingerprint, and fetches for a consumer only through a
store opened with that consumer's own options. Across nodes the same rule
holds with the key derived from the cluster secret instead, so that every
node computes the same identity for the same URL, options and manifest:
a node fetches from the origin for a peer only through a dataset version it
holds itself under the very identity and fingerprint the peer sent, i.e.
with the same credentials the peer's own consumer proved at the origin. The
identity is an HMAC: it reveals no option to whoever sees it, and only
nodes holding the cluster secret can compute (or test guesses of) one.
"""

from __future__ import annotations

import weakref

from ..identity import SourceIdentities
from ..daemon_client.protocol import manifest_fingerprint
from ..engine import Dataset
from .auth import derive_key


class ClusterIdentities:
    """(identity, fingerprint) of datasets, computed once per opened dataset."""

    def __init__(self, secret: bytes) -> None:
        self._identities = SourceIdentities(derive_key(secret, "dataset identities"))
        self._known: weakref.WeakKeyDictionary[Dataset, tuple[str, str]] = weakref.WeakKeyDictionary()

    def of(self, dataset: Dataset, fingerprint: str | None = None) -> tuple[str, str]:
        """The cluster identity of ``dataset``'s source and its manifest's fingerprint."""
        known = self._known.get(dataset)
        if known is None:
            known = (self._identities.access(dataset.source), fingerprint or manifest_fingerprint(dataset.manifest))
            self._known[dataset] = known
        return known
