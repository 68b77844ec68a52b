"""Peer requests proved with the cluster secret, never sending it: HMAC-SHA256, a replay window, nonces.

Every peer request but ``/healthz`` carries three headers:

- ``X-Stager-Peer-Time``: the sender's Unix time (seconds, decimal);
- ``X-Stager-Peer-Nonce``: 32 random hex digits, new for every request;
- ``X-Stager-Peer-Signature``: hex HMAC-SHA256, under a key derived from the
  cluster secret, of the method, the blob digest, the byte range, the time,
  the nonce and the request's context (dataset identity, manifest
  fingerprint, shard index, mode, asker), one per line.

The receiver recomputes the signature and compares in constant time
(:func:`hmac.compare_digest`), refuses a time more than ``window`` seconds
from its own clock, and refuses a nonce it has already accepted within the
window (it keeps accepted nonces until their time falls out of the window,
so the table is bounded by the request rate times twice the window). Any
refusal is a 401 with no data. Answers are not signed: their bytes are
verified against the manifest by the asker, which is stronger.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ..errors import ConfigError

TIME_HEADER = "X-Stager-Peer-Time"
NONCE_HEADER = "X-Stager-Peer-Nonce"
SIGNATURE_HEADER = "X-Stager-Peer-Signature"
SECRET_ENV = "STAGER_PEER_SECRET"
#: Seconds a request's time may differ from the receiver's clock.
REPLAY_WINDOW = 30.0
#: The shortest cluster secret accepted (bytes), so that it cannot be guessed.
MIN_SECRET = 16
#: Nonces remembered at most; past this, requests are refused until old ones expire (a flood, not a peer).
MAX_NONCES = 1_000_000


def load_secret(path: str | None, environ: Mapping[str, str] | None = None) -> bytes:
    """The cluster secret: the file at ``path`` (surrounding whitespace stripped), else ``STAGER_PEER_SECRET``.

    Raises:
        ConfigError: neither is given, the file cannot be read, or the secret is shorter than
            :data:`MIN_SECRET` bytes (the message never shows the secret).
    """
    env = os.environ if environ is None else environ
    if path:
        try:
            secret = Path(path).read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"--peer-secret-file {path}: cannot read it: {exc.strerror or exc}") from exc
        where = f"--peer-secret-file {path}"
    elif env.get(SECRET_ENV):
        secret = env[SECRET_ENV].strip().encode()
        where = SECRET_ENV
    else:
        raise ConfigError("--peers needs the cluster secret: --peer-secret-file PATH or STAGER_PEER_SECRET "
                          "(the same on every node, at least 16 bytes; e.g. `openssl rand -hex 32`)")
    if len(secret) < MIN_SECRET:
        raise ConfigError(f"{where}: the cluster secret has {len(secret)} bytes; it needs at least {MIN_SECRET}")
    return secret


def derive_key(secret: bytes, purpose: str) -> bytes:
    """A key for one purpose (request signatures, dataset identities), so no two uses share one."""
    return hmac.new(secret, f"stager cluster v1: {purpose}".encode(), hashlib.sha256).digest()


def _message(method: str, digest: str, start: int, end: int, stamp: str, nonce: str, context: str) -> bytes:
    return "\n".join((method.upper(), digest, f"{start}-{end}", stamp, nonce, context)).encode()


class PeerAuth:
    """Signs this node's peer requests and checks the ones it receives.

    Args:
        secret: the cluster secret (the same on every node).
        window: seconds of clock difference accepted, and how long a nonce is remembered.
        clock: the time source (Unix seconds).
    """

    def __init__(self, secret: bytes, *, window: float = REPLAY_WINDOW,
                 clock: Callable[[], float] = time.time) -> None:
        self._key = derive_key(secret, "peer requests")
        self.window = window
        self._clock = clock
        self._nonces: dict[str, float] = {}
        self._next_prune = 0.0

    def sign(self, method: str, digest: str, start: int, end: int, context: str = "") -> dict[str, str]:
        """The headers that prove this request (a fresh nonce each time)."""
        stamp = f"{self._clock():.3f}"
        nonce = secrets.token_hex(16)
        mac = hmac.new(self._key, _message(method, digest, start, end, stamp, nonce, context), hashlib.sha256)
        return {TIME_HEADER: stamp, NONCE_HEADER: nonce, SIGNATURE_HEADER: mac.hexdigest()}

    def check(self, method: str, digest: str, start: int, end: int, context: str,
              headers: Mapping[str, str]) -> str | None:
        """None if the request is proved, fresh and new; else why not (for the log, never for the peer)."""
        stamp, nonce, signature = (headers.get(TIME_HEADER), headers.get(NONCE_HEADER),
                                   headers.get(SIGNATURE_HEADER))
        if not stamp or not nonce or not signature:
            return "no signature"
        if len(nonce) > 64 or len(signature) != 64:
            return "malformed signature"
        expected = hmac.new(self._key, _message(method, digest, start, end, stamp, nonce, context),
                            hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, signature.lower()):
            return "bad signature"
        try:
            sent = float(stamp)
        except ValueError:
            return "malformed time"
        now = self._clock()
        if not abs(now - sent) <= self.window:  # also refuses nan
            return f"stale time ({now - sent:+.0f}s from this node's clock)"
        self._prune(now)
        if nonce in self._nonces:
            return "replayed nonce"
        if len(self._nonces) >= MAX_NONCES:
            return "too many requests in the replay window"
        self._nonces[nonce] = sent
        return None

    def _prune(self, now: float) -> None:
        if now < self._next_prune:
            return
        self._next_prune = now + self.window / 4
        horizon = now - 2 * self.window  # a nonce is refused by its time alone past this
        self._nonces = {n: t for n, t in self._nonces.items() if t >= horizon}
