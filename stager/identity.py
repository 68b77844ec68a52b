"""Who a dataset request speaks for: keyed hashes of its source, never the credentials themselves.

The daemon serves many consumers from one process, and each must get only
what its own storage options can read. So a dataset the daemon holds is
named by two identities, both HMAC-SHA256 digests under a random key that
lives only in this daemon's memory (so they cannot be compared across
daemons, guessed offline, or turned back into a secret; the daemon looks
them up as dictionary keys, which compares digests, never secrets):

- the *access* identity: the normalised URL and every storage option
  (endpoint, region, keys, tokens, headers, anything else). Two requests
  share it only when they would open the very same store with the very same
  credentials. A new access identity proves itself against the origin
  before it is served anything (see ``datasets.py``).
- the *location* identity: the normalised URL and the storage options
  without the ones that hold credentials (:data:`CREDENTIAL_OPTIONS`): what
  the data is, as opposed to who reads it. A credential set that proved it
  can read a location's manifest may use a manifest version of that
  location the daemon still holds for other consumers.

Storage options without credentials (``{}``, ``{"anon": true}``) are
compared like any others: every consumer that sends the same ones shares one
access identity, and the daemon reads for them with its own environment's
credentials (or anonymously). Only the digests are kept in keys; the options
stay inside the store that uses them and are never logged or shown.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any, Mapping

from .config import SourceConfig
from .store import split_protocol

#: Storage options (at any depth) that hold credentials rather than say where the data is.
CREDENTIAL_OPTIONS = frozenset({
    "key", "secret", "token", "password", "anon", "profile", "session_token",
    "aws_access_key_id", "aws_secret_access_key", "aws_session_token",
    "account_key", "sas_token", "credential", "credentials", "client_secret", "connection_string",
    "authorization", "cookie",
})


class SourceIdentities:
    """Keyed digests of dataset sources; one key per daemon, made at random when the daemon starts."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def access(self, source: SourceConfig) -> str:
        """The identity of URL and credentials together (see the module doc)."""
        return self._digest("access", normalise_url(source.url), source.storage_options)

    def location(self, source: SourceConfig) -> str:
        """The identity of what is read, whoever reads it (the options without credentials)."""
        return self._digest("location", normalise_url(source.url), _without_credentials(source.storage_options))

    def _digest(self, kind: str, url: str, options: Any) -> str:
        message = json.dumps([kind, url, options], sort_keys=True, separators=(",", ":"), default=repr)
        return hmac.new(self._key, message.encode(), hashlib.sha256).hexdigest()


def normalise_url(url: str) -> str:
    """One spelling per dataset: the protocol in lower case, no trailing slashes (``s3://b/x/`` is ``s3://b/x``)."""
    protocol, path = split_protocol(url)
    path = path.rstrip("/") or path
    return f"{protocol.lower()}://{path}" if protocol else path


def _without_credentials(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_credentials(v) for k, v in value.items() if str(k).lower() not in CREDENTIAL_OPTIONS}
    if isinstance(value, list):
        return [_without_credentials(v) for v in value]
    return value
