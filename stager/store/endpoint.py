"""HTTP(S) URLs checked once, where a store is made: a URL no request could go to is a config error.

Without this, a source or an endpoint such as ``http://[::1`` or
``http://host:99999`` reached the first request and failed there with the URL
parser's bare ``ValueError``, after the command had started its work.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..errors import ConfigError


def check_http_url(url: str, named: str) -> None:
    """Raise ``ConfigError`` naming ``named`` (where the URL came from) if ``url`` is not a usable
    http(s) URL: another scheme, no host, a bracket left open, a port that is not one."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{named}: not a usable URL: {exc}") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ConfigError(f"{named}: not an http(s) URL")
    if not parts.hostname:
        raise ConfigError(f"{named}: no host in the URL")
    if port == 0:
        raise ConfigError(f"{named}: port 0 is not one to connect to")
