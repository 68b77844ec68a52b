"""The wire between the daemon and its consumers: routes, errors as JSON, manifest fingerprints.

HTTP/1.1 with JSON bodies over the daemon's Unix socket (see ``api.py`` for
the routes). Only control travels here, never data: a readiness answer is the
path of a complete, verified file in the shared cache, which the consumer
opens itself.

Errors travel as ``{"error": {"type": NAME, "message": TEXT}}``. ``NAME`` is
the class name of a :class:`~stager.errors.StagerError` (``ShardNotFound``,
``OriginUnavailable``, ``CacheFull``, ...), which the client raises again as
the same class (the daemon's own, ``UnknownPlan`` and the rest, are there too). The status code says who
is at fault (4xx the request, 502 the origin, 507 the cache, 503 a daemon that
is stopping) but clients decide by ``type``.

A dataset is named on the wire by its source (URL and storage options, which
may hold credentials: the socket is private, and neither side logs them) and
by the *fingerprint* of its manifest, an xxh3-128 over the shards' digests in
manifest order. Both sides load and validate the manifest themselves; equal
fingerprints mean that a position means the same blob on both sides.

A consumer's plans are bound to it: every request about consumer ``c``
carries, in the ``X-Stager-Consumer-Key`` header, a random key the consumer
made for itself; the daemon keeps a digest of the key it first saw for ``c``
and refuses requests with another (:class:`ConsumerKeyMismatch`), so knowing a
consumer's id (``stager status`` shows it) does not let anyone else read,
move or close its plans.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xxhash

from .. import errors as _errors
from ..errors import (ConsumerKeyMismatch, DaemonError, DaemonRequestError, DaemonUnavailable, ManifestVersionGone,
                      StagerError, UnknownPlan)
from ..manifest import Manifest

API = "/v1"
API_VERSION = 1
INSTANCE_HEADER = "X-Stager-Instance"
CONSUMER_KEY_HEADER = "X-Stager-Consumer-Key"

#: A readiness answer that says "not yet, ask again".
PENDING = 202


def error_status(exc: BaseException) -> int:
    """The HTTP status for an error raised while serving a request."""
    if isinstance(exc, UnknownPlan):
        return 404
    if isinstance(exc, ConsumerKeyMismatch):
        return 403
    if isinstance(exc, ManifestVersionGone):
        return 409
    if isinstance(exc, DaemonRequestError):
        return 400
    if isinstance(exc, DaemonUnavailable):
        return 503
    if isinstance(exc, (_errors.ConfigError, _errors.ManifestError)):
        return 422
    if isinstance(exc, _errors.OriginError):
        return 502
    if isinstance(exc, _errors.CacheError):
        return 507
    return 500


def error_body(exc: BaseException) -> dict[str, Any]:
    """``{"error": {"type", "message"}}`` for ``exc`` (unexpected errors become ``InternalError``)."""
    name = type(exc).__name__ if isinstance(exc, StagerError) else "InternalError"
    message = str(exc) if isinstance(exc, StagerError) else f"internal error in the daemon: {type(exc).__name__}: {exc}"
    return {"error": {"type": name, "message": message}}


def error_from_body(status: int, body: Any, where: str) -> StagerError:
    """The exception a client raises for an error answer, of the class the daemon named when known."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return DaemonError(f"daemon at {where}: HTTP {status} without an error description")
    name, message = str(error.get("type", "")), str(error.get("message", ""))
    candidate = getattr(_errors, name, None) if name in _errors.__all__ else None
    cls = candidate if isinstance(candidate, type) and issubclass(candidate, StagerError) else None
    if cls is None:
        return DaemonError(f"daemon at {where}: {message or f'HTTP {status}'}")
    return cls(message)


def manifest_fingerprint(manifest: Manifest) -> str:
    """xxh3-128 over the shard count and every shard's digest in manifest order (32 hex digits)."""
    col = manifest.table.column("digest").combine_chunks()
    raw = np.frombuffer(col.buffers()[1], dtype=np.uint8)[col.offset * 16:(col.offset + len(col)) * 16] \
        if len(col) else np.zeros(0, np.uint8)
    h = xxhash.xxh3_128()
    h.update(len(manifest).to_bytes(8, "little"))
    h.update(np.ascontiguousarray(raw).tobytes())
    return h.hexdigest()
