"""The cluster settings of ``stager serve`` (``--peer-*``), checked once at start-up, and its TLS contexts.

TLS is optional. With ``--peer-tls-cert`` and ``--peer-tls-key`` the peer
listener speaks HTTPS; with ``--peer-tls-ca`` too, it also requires a client
certificate signed by that CA, and this node checks the certificates of the
peers it asks against the same CA. Peers are addressed by IP as often as by
name (``dns:`` gives IPs), so a certificate is checked against the CA, not
against the peer's host name: any node holding a certificate from the
cluster's CA is a peer, and the HMAC proves the cluster secret besides.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..config import parse_address
from .membership import PeerSpec, parse_peer_spec
from .placement import DEFAULT_FANOUT


@dataclass(frozen=True, slots=True)
class PeerConfig:
    """What a node of a cluster needs beside the daemon's settings.

    Attributes:
        listen: the peer listener's (host, port); port 0 picks a free one (tests).
        spec: who the members are (``membership.py``).
        secret: the cluster secret (never shown: not in the repr).
        tls_cert, tls_key, tls_ca: PEM files (see the module doc); all None: plain HTTP.
        bandwidth: bytes per second sent to any one peer (None: no cap).
        per_peer: requests served at once to any one peer, and connections to each.
        fanout: children per node in a blob's spreading tree.
        health_interval: seconds between health checks of every peer.
        refresh: seconds between DNS look-ups (``dns:``).
    """

    listen: tuple[str, int]
    spec: PeerSpec
    secret: bytes = field(repr=False)
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    bandwidth: int | None = None
    per_peer: int = 8
    fanout: int = DEFAULT_FANOUT
    health_interval: float = 2.0
    refresh: float = 30.0

    def __post_init__(self) -> None:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("--peer-tls-cert and --peer-tls-key go together")
        if self.tls_ca and not self.tls_cert:
            raise ConfigError("--peer-tls-ca needs --peer-tls-cert and --peer-tls-key (this node's own certificate)")
        if self.per_peer < 1 or self.fanout < 1:
            raise ConfigError("per-peer concurrency and fanout must be >= 1")

    @classmethod
    def build(cls, listen: str, peers: str, secret: bytes, **settings: object) -> "PeerConfig":
        """From the flags' text. Raises ConfigError naming the flag."""
        host, port = parse_address(listen, what="--peer-listen")
        return cls((host, port), parse_peer_spec(peers, port), secret, **settings)  # type: ignore[arg-type]

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def server_ssl(self) -> ssl.SSLContext | None:
        """The listener's TLS context (None: plain HTTP). Raises ConfigError if a file is unusable."""
        if not self.tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._load(context)
        if self.tls_ca:
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_ssl(self) -> ssl.SSLContext | None:
        """The context this node asks peers with (None: plain HTTP)."""
        if not self.tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        context.check_hostname = False  # peers are often addressed by IP; the CA and the HMAC vouch for them
        self._load(context)
        if not self.tls_ca:
            context.verify_mode = ssl.CERT_NONE  # encrypted only; the HMAC still proves the secret
        return context

    def _load(self, context: ssl.SSLContext) -> None:
        try:
            context.load_cert_chain(self.tls_cert, self.tls_key)  # type: ignore[arg-type]
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--peer-tls-cert {self.tls_cert} / --peer-tls-key {self.tls_key}: "
                              f"cannot load them: {getattr(exc, 'strerror', None) or exc}") from exc
        if self.tls_ca:
            try:
                context.load_verify_locations(self.tls_ca)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"--peer-tls-ca {self.tls_ca}: cannot load it: "
                                  f"{getattr(exc, 'strerror', None) or exc}") from exc
