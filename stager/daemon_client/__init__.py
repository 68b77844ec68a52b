"""The node daemon's client half: its wire protocol, a client for its socket, and where that socket is.

Everything a consumer needs to talk to ``stager serve`` and nothing of the
server (no engine, no aiohttp.web, no prometheus-client), so a data loader
worker that merely talks to a daemon loads none of it. ``protocol.py`` holds
the routes, errors as JSON and manifest fingerprints (the server answers in
the same terms); ``client.py`` sends one request over the Unix socket, probes
``/healthz`` without an event loop and tells whether a daemon serves a given
cache directory; ``socket_path.py`` finds the default socket the same way the
daemon does. The sessions (``stager.session``) build on it.
"""

from __future__ import annotations

from .client import DaemonClient, probe, same_cache
from .protocol import manifest_fingerprint
from ..socket_path import default_socket_path

__all__ = ["DaemonClient", "default_socket_path", "manifest_fingerprint", "probe", "same_cache"]
