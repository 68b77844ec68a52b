"""Every kind of lower-library error maps to the right stager error, in one place."""

from __future__ import annotations

import errno
import http.client

import aiohttp
import botocore.exceptions as boto
import pytest
from s3fs.errors import translate_boto_error

from stager.errors import (
    AccessDenied,
    OriginError,
    OriginUnavailable,
    ShardNotFound,
    StagerError,
    Throttled,
    TransientOriginError,
)
from stager.store.base import InvalidRange
from stager.store.translate import error_for_status, origin_error, translated


def client_error(code: str, status: int, message: str = "msg", headers: dict | None = None) -> boto.ClientError:
    return boto.ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers or {}},
        },
        "GetObject",
    )


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("NoSuchKey", 404, ShardNotFound),
        ("404", 404, ShardNotFound),
        ("NoSuchBucket", 404, ShardNotFound),
        ("AccessDenied", 403, AccessDenied),
        ("InvalidAccessKeyId", 403, AccessDenied),
        ("SignatureDoesNotMatch", 403, AccessDenied),
        ("SlowDown", 503, Throttled),
        ("ServiceUnavailable", 503, Throttled),
        ("Throttling", 400, Throttled),
        ("InternalError", 500, TransientOriginError),
        ("RequestTimeout", 400, TransientOriginError),
        ("", 502, TransientOriginError),
        ("InvalidRange", 416, InvalidRange),
        ("InvalidArgument", 400, OriginError),
    ],
)
def test_botocore_client_errors(code, status, kind):
    err = origin_error(client_error(code, status), "a.bin")
    assert type(err) is kind
    assert "a.bin" in str(err)


def test_s3fs_wrapped_client_error_is_seen_through():
    # s3fs turns a ClientError into a builtin OSError with the original as __cause__.
    wrapped = translate_boto_error(client_error("SlowDown", 503))
    assert not isinstance(wrapped, boto.ClientError)
    assert type(origin_error(wrapped, "a.bin")) is Throttled
    wrapped = translate_boto_error(client_error("NoSuchKey", 404))
    assert type(origin_error(wrapped, "a.bin")) is ShardNotFound


def test_retry_after_is_kept_on_throttling():
    err = origin_error(client_error("SlowDown", 503, headers={"retry-after": "2"}), "a")
    assert err.retry_after == 2.0
    assert error_for_status(429, "a", retry_after="Wed, 21 Oct 2015 07:28:00 GMT").retry_after is None


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (404, ShardNotFound), (410, ShardNotFound), (401, AccessDenied), (403, AccessDenied),
        (429, Throttled), (503, Throttled), (500, TransientOriginError), (502, TransientOriginError),
        (504, TransientOriginError), (408, TransientOriginError), (416, InvalidRange), (400, OriginError),
    ],
)
def test_http_statuses(status, kind):
    assert type(error_for_status(status, "a.bin")) is kind
    response_error = aiohttp.ClientResponseError(None, (), status=status, message="m")  # type: ignore[arg-type]
    assert type(origin_error(response_error, "a.bin")) is kind


def test_s3_code_wins_over_status():
    assert type(error_for_status(503, "a", code="SlowDown")) is Throttled
    assert type(error_for_status(400, "a", code="ExpiredToken")) is AccessDenied
    assert type(error_for_status(404, "a", code="NoSuchKey")) is ShardNotFound


@pytest.mark.parametrize(
    "exc",
    [
        aiohttp.ClientPayloadError("Response payload is not completed"),
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientConnectionResetError("reset"),
        aiohttp.ClientOSError(errno.ECONNRESET, "reset"),
        aiohttp.ServerTimeoutError("read timeout"),
        boto.ReadTimeoutError(endpoint_url="http://x"),
        boto.ConnectTimeoutError(endpoint_url="http://x"),
        boto.EndpointConnectionError(endpoint_url="http://x"),
        boto.ConnectionClosedError(endpoint_url="http://x"),
        boto.ResponseStreamingError(error="boom"),
        boto.IncompleteReadError(actual_bytes=1, expected_bytes=2),
        http.client.IncompleteRead(b"12", 10),
        TimeoutError(),
        ConnectionResetError(errno.ECONNRESET, "reset"),
        OSError(errno.EIO, "I/O error"),
        OSError(errno.ESTALE, "stale handle"),
        OSError(errno.ETIMEDOUT, "timed out"),
    ],
)
def test_transient_failures(exc):
    err = origin_error(exc, "a.bin")
    assert type(err) is TransientOriginError
    assert isinstance(err, OriginUnavailable)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (FileNotFoundError(errno.ENOENT, "no such file"), ShardNotFound),
        (OSError(errno.ENOTDIR, "not a dir"), ShardNotFound),
        (PermissionError(errno.EACCES, "denied"), AccessDenied),
        (OSError(errno.EROFS, "read-only"), AccessDenied),
        (OSError(errno.ENOSPC, "full"), OriginError),
        (boto.NoCredentialsError(), AccessDenied),
    ],
)
def test_os_and_credential_errors(exc, kind):
    assert type(origin_error(exc, "a.bin")) is kind


def test_unknown_errors_are_bugs_and_not_translated():
    assert origin_error(ValueError("bug"), "a") is None
    assert origin_error(KeyError("bug"), "a") is None


def test_stager_errors_pass_through():
    err = ShardNotFound("x")
    assert origin_error(err, "a") is err


def test_translated_raises_from_the_original():
    original = aiohttp.ServerDisconnectedError()
    with pytest.raises(TransientOriginError) as info:
        with translated("shard-1.bin [0, 10)"):
            raise original
    assert info.value.__cause__ is original
    assert "shard-1.bin [0, 10)" in str(info.value)


def test_translated_lets_bugs_and_own_errors_through():
    with pytest.raises(ZeroDivisionError):
        with translated("a"):
            1 / 0  # noqa: B018
    own = AccessDenied("mine")
    with pytest.raises(AccessDenied) as info:
        with translated("a"):
            raise own
    assert info.value is own


def test_every_translation_is_a_stager_error():
    for exc in (OSError(errno.EIO, "x"), FileNotFoundError(), aiohttp.ServerDisconnectedError()):
        assert isinstance(origin_error(exc, "a"), StagerError)


def test_a_bug_raised_while_handling_a_client_error_stays_a_bug():
    try:
        try:
            raise client_error("SlowDown", 503)
        except boto.ClientError:
            raise TypeError("bug in handler")  # noqa: B904
    except TypeError as exc:
        assert origin_error(exc, "a") is None
