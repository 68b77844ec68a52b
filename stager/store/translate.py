"""The one place where errors of lower libraries become stager errors.

Stores wrap every call into botocore, aiobotocore, s3fs, fsspec, our HTTP
client (:mod:`stager.store.wire`, which fails with ``OSError`` subclasses)
and the OS in :func:`translated`, which maps what it knows and lets anything
else (a bug) through untouched. HTTP origins that parse responses themselves
use :func:`error_for_status`. The mapping:

==========================================  ==========================================
what the library says                       what stager raises
==========================================  ==========================================
S3 code NoSuchKey/NoSuchBucket/NotFound,    ShardNotFound (never retried)
HTTP 404/410, FileNotFoundError, ENOENT
S3 code AccessDenied/InvalidAccessKeyId/    AccessDenied (never retried)
SignatureDoesNotMatch/ExpiredToken...,
HTTP 401/403, PermissionError, missing
credentials
S3 code SlowDown/Throttling/                Throttled (retried, longer backoff,
ServiceUnavailable..., HTTP 429/503         honours Retry-After)
S3 InternalError/RequestTimeout, HTTP 5xx,  TransientOriginError (retried)
408, reset/closed connection, incomplete
or truncated body, timeouts, EIO/EAGAIN/
ETIMEDOUT/ESTALE/EBUSY/ECONNRESET
S3 InvalidRange, HTTP 416                   InvalidRange (never retried)
any other HTTP 4xx or OSError errno,        OriginError (never retried)
TLS certificate errors
==========================================  ==========================================

s3fs hides botocore's ``ClientError`` behind a builtin ``OSError`` but keeps
it as ``__cause__``; :func:`origin_error` walks the cause chain to find it.
"""

from __future__ import annotations

import errno
import socket
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from ..errors import (
    AccessDenied,
    OriginError,
    ShardNotFound,
    StagerError,
    Throttled,
    TransientOriginError,
)
from .base import InvalidRange



def _botocore() -> tuple[Any, Any] | None:
    """botocore's exceptions module and ResponseParserError, if botocore is loaded.

    Not imported here: a process that never loaded botocore (the S3 read path
    does without it) cannot be holding one of its errors, and importing it
    costs a tenth of a second of start-up.
    """
    if "botocore.exceptions" not in sys.modules:
        return None
    import botocore.exceptions
    from botocore.parsers import ResponseParserError

    return botocore.exceptions, ResponseParserError


def _aiohttp() -> Any:
    """aiohttp, if loaded (as botocore above: a process that never loaded it holds none of its errors)."""
    return sys.modules.get("aiohttp")


def _is_http_client_cut(exc: BaseException) -> bool:
    """A body cut short or a connection dropped, as the standard library's HTTP client says it
    (imported only by clients that use it: if it is not loaded, ``exc`` cannot be one of its errors)."""
    client = sys.modules.get("http.client")
    return client is not None and isinstance(exc, (client.IncompleteRead, client.RemoteDisconnected))


def _tls_error(exc: BaseException, what: str) -> OriginError | None:
    """A TLS failure: a rejected certificate is not retried, a broken TLS stream is."""
    ssl = sys.modules.get("ssl")
    if ssl is None or not isinstance(exc, ssl.SSLError):
        return None
    if isinstance(exc, ssl.SSLCertVerificationError):
        return OriginError(f"{what}: TLS certificate rejected: {exc}")
    return TransientOriginError(f"{what}: TLS error: {_describe(exc)}")


NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "NoSuchUpload", "NoSuchVersion", "404"})
DENIED_CODES = frozenset({
    "AccessDenied", "AllAccessDisabled", "AccountProblem", "Forbidden", "InvalidAccessKeyId",
    "InvalidToken", "ExpiredToken", "TokenRefreshRequired", "SignatureDoesNotMatch",
    "InvalidSecurity", "NotSignedUp", "Unauthorized", "401", "403",
})
THROTTLE_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
    "RequestLimitExceeded", "TooManyRequests", "TooManyRequestsException",
    "ServiceUnavailable", "RequestThrottledException", "429", "503",
})
TRANSIENT_CODES = frozenset({
    "InternalError", "InternalFailure", "RequestTimeout", "RequestTimeoutException",
    "BadGateway", "GatewayTimeout", "ServerError", "OperationAborted",
    "XAmzContentSHA256Mismatch", "IncompleteBody", "500", "502", "504",
})
RANGE_CODES = frozenset({"InvalidRange", "416"})

TRANSIENT_ERRNOS = frozenset({
    errno.EIO, errno.EAGAIN, errno.ETIMEDOUT, errno.ESTALE, errno.EBUSY, errno.EINTR,
    errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.EPIPE, errno.ENETDOWN,
    errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EHOSTDOWN, errno.ENOLINK, errno.ECOMM,
    errno.EREMOTEIO, errno.ENOTCONN,
})
NOT_FOUND_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR})
DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def error_for_status(
    status: int,
    what: str,
    *,
    code: str | None = None,
    detail: str | None = None,
    retry_after: str | float | None = None,
) -> OriginError:
    """The stager error for a failed HTTP answer (``code`` is the S3 error code if any)."""
    label = f"HTTP {status}" + (f" {code}" if code else "")
    if detail and detail == code:
        detail = None
    text = f"{what}: {label}" + (f": {detail}" if detail else "")
    key = code or ""
    if key in RANGE_CODES or status == 416:
        return InvalidRange(f"{text} (range not satisfiable)")
    if key in NOT_FOUND_CODES or (not key and status in (404, 410)):
        return ShardNotFound(f"{what}: not found ({label})")
    if key in DENIED_CODES or (not key and status in (401, 403)):
        return AccessDenied(f"{what}: access denied ({label})" + (f": {detail}" if detail else ""))
    if key in THROTTLE_CODES or status in (429, 503):
        err: OriginError = Throttled(f"{text} (throttled)")
        err.retry_after = _parse_retry_after(retry_after)  # type: ignore[attr-defined]
        return err
    if key in TRANSIENT_CODES or status >= 500 or status == 408:
        return TransientOriginError(text)
    if status in (404, 410):
        return ShardNotFound(f"{what}: not found ({label})")
    if status in (401, 403):
        return AccessDenied(f"{what}: access denied ({label})")
    return OriginError(text)


def origin_error(exc: BaseException, what: str) -> OriginError | None:
    """The stager error for ``exc``, or None if it is not a known origin failure (a bug)."""
    if isinstance(exc, StagerError):
        return exc if isinstance(exc, OriginError) else None
    boto = _botocore()
    _boto, _ResponseParserError = boto if boto is not None else (None, None)
    client_error = _find_cause(exc, _boto.ClientError) if _boto is not None else None
    if client_error is not None:
        return _from_client_error(client_error, what)
    aiohttp = _aiohttp()
    if aiohttp is not None:
        if isinstance(exc, aiohttp.ClientResponseError):
            return error_for_status(exc.status, what, detail=exc.message or None)
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            return OriginError(f"{what}: TLS certificate rejected: {exc}")
        if isinstance(exc, (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError)):
            return TransientOriginError(f"{what}: {_describe(exc)}")
    if (tls := _tls_error(exc, what)) is not None:
        return tls
    if _boto is not None:
        if isinstance(exc, (_boto.NoCredentialsError, _boto.PartialCredentialsError)):
            return AccessDenied(f"{what}: no usable credentials: {exc}")
        if isinstance(exc, _boto.SSLError):
            return OriginError(f"{what}: TLS error: {exc}")
        if isinstance(exc, (_boto.HTTPClientError, _boto.ConnectionError, _boto.IncompleteReadError,
                            _boto.ChecksumError, _ResponseParserError)):
            return TransientOriginError(f"{what}: {_describe(exc)}")
    if isinstance(exc, EOFError) or _is_http_client_cut(exc):
        return TransientOriginError(f"{what}: {_describe(exc)}")
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return TransientOriginError(f"{what}: timed out ({_describe(exc)})")
    if isinstance(exc, FileNotFoundError):
        return ShardNotFound(f"{what}: not found")
    if isinstance(exc, PermissionError):
        return AccessDenied(f"{what}: permission denied ({_describe(exc)})")
    if isinstance(exc, ConnectionError):
        return TransientOriginError(f"{what}: {_describe(exc)}")
    if isinstance(exc, OSError):
        if exc.errno in NOT_FOUND_ERRNOS:
            return ShardNotFound(f"{what}: not found ({_describe(exc)})")
        if exc.errno in DENIED_ERRNOS:
            return AccessDenied(f"{what}: permission denied ({_describe(exc)})")
        if exc.errno in TRANSIENT_ERRNOS:
            return TransientOriginError(f"{what}: {_describe(exc)}")
        return OriginError(f"{what}: {_describe(exc)}")
    return None


def relocated(exc: OriginError, what: str, url: str, endpoint: str | None = None) -> OriginError:
    """``exc`` again (same class), its message naming the whole ``url`` (and ``endpoint``) instead of ``what``.

    Stores name objects by their path below the root; a message the user reads on its own
    (the manifest could not be read) needs the URL and the server that refused it. Any
    credentials in the endpoint are left out.
    """
    where = url + (f" (endpoint {_without_userinfo(endpoint)})" if endpoint else "")
    text = str(exc)
    if text.startswith(f"{what}: "):
        text = text[len(what) + 2:]
    text = text.replace(f"last error: {what}: ", "last error: ")
    err = type(exc)(f"{where}: {text}")
    for name, value in vars(exc).items():  # retry_after and the like
        setattr(err, name, value)
    return err


def _without_userinfo(endpoint: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(endpoint)
    if parts.username is None and parts.password is None:
        return endpoint
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Re-raise known lower-library errors raised inside the block as stager errors."""
    try:
        yield
    except StagerError:
        raise
    except Exception as exc:
        err = origin_error(exc, what)
        if err is None:
            raise
        raise err from exc


def _from_client_error(exc: BaseException, what: str) -> OriginError:
    response = getattr(exc, "response", None) or {}
    error = response.get("Error") or {}
    meta = response.get("ResponseMetadata") or {}
    status = int(meta.get("HTTPStatusCode") or 0)
    code = str(error.get("Code") or "") or None
    headers = meta.get("HTTPHeaders") or {}
    return error_for_status(
        status, what, code=code, detail=error.get("Message") or None, retry_after=headers.get("retry-after")
    )


def _find_cause(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 8:  # bounded: cause chains may loop
        if isinstance(cur, kind):
            return cur
        # Follow explicit causes; implicit context only through OSErrors, the
        # way s3fs re-raises (a bug raised while handling must stay a bug).
        cur = cur.__cause__ if cur.__cause__ is not None else (cur.__context__ if isinstance(cur, OSError) else None)
        seen += 1
    return None


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def _parse_retry_after(value: str | float | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None  # an HTTP date: rare from object stores, and our backoff copes
    return seconds if seconds >= 0 else None
