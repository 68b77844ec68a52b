"""HTTP(S) URLs checked once, where a store is made: a URL no request could go to is a config error.

Without this, a source or an endpoint such as ``http://[::1`` or
``http://host:99999`` reached the first request and failed there with the URL
parser's bare ``ValueError``, after the command had started its work.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from ..errors import ConfigError

_USERINFO = re.compile(r"//[^/@]*@")


def shown_url(url: str) -> str:
    """``url`` as an error message may show it: a user and password in it replaced by ``***``."""
    return _USERINFO.sub("//***@", url, count=1)


def check_http_url(url: str, given_as: str | None = None) -> None:
    """Raise ``ConfigError`` if ``url`` is not a usable http(s) URL: another scheme, no host, a
    bracket left open, a port that is not one. The message names ``given_as`` (the option or
    variable it came from, as ``NAME=URL``) and never a password inside the URL."""
    named = f"{given_as}={shown_url(url)}" if given_as else shown_url(url)
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
