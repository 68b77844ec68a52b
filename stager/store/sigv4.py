"""AWS Signature Version 4, stdlib only.

The S3 store signs every request it sends itself with this (botocore, when
it is loaded at all, only supplies credentials and the endpoint), so the read
path costs no botocore import or request machinery. The test harness uses it
too: to create buckets on the rclone S3 server and to re-sign a request the
fault proxy has changed (dropping the ``Range`` header to simulate an origin
that ignores it).

How it works: the canonical request is built from the method, the path exactly
as it goes on the wire (S3 does not normalise or double-encode it), the query
string with every name and value RFC 3986-encoded and sorted, the signed
headers (lower-cased, whitespace folded, sorted) and the payload hash (the
``x-amz-content-sha256`` value). Its SHA-256 is signed with the key derived
from the secret, date, region and service. `sign_headers` signs a new request;
`resign_headers` recomputes the signature of an already signed request after
some headers were removed, keeping its access key, date, scope and the rest of
its signed-header list.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from urllib.parse import quote, unquote, urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"

_AUTH_RE = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=(?P<cred>[^,\s]+)\s*,\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+)\s*,\s*Signature=(?P<sig>[0-9a-fA-F]+)"
)


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


@functools.lru_cache(maxsize=16)
def signing_key(secret_key: str, date: str, region: str, service: str) -> bytes:
    """Derive the SigV4 signing key for ``date`` (YYYYMMDD).

    Kept for the next request: the key changes only with the day (or the credentials), and deriving
    it was half the cost of signing one (four HMACs); thousands of small shards sign a request each.
    """
    k_date = _hmac(("AWS4" + secret_key).encode(), date)
    return _hmac(_hmac(_hmac(k_date, region), service), "aws4_request")


def canonical_query(raw_query: str) -> str:
    """Return the canonical form of a raw (wire) query string."""
    pairs = []
    for part in raw_query.split("&") if raw_query else ():
        if not part:
            continue
        name, _, value = part.partition("=")
        pairs.append((quote(unquote(name), safe="-_.~"), quote(unquote(value), safe="-_.~")))
    return "&".join(f"{n}={v}" for n, v in sorted(pairs))


def _canonical_headers(headers: Mapping[str, str], names: Iterable[str]) -> str:
    lowered = {k.lower(): v for k, v in headers.items()}
    lines = []
    for name in names:
        value = " ".join(str(lowered.get(name, "")).split())
        lines.append(f"{name}:{value}\n")
    return "".join(lines)


def signature(
    *,
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    signed_headers: list[str],
    payload_hash: str,
    amz_date: str,
    scope: str,
    secret_key: str,
) -> str:
    """Compute the hex SigV4 signature of one request.

    Args:
        raw_path: the request path as sent on the wire (already percent-encoded).
        raw_query: the query string as sent on the wire, without ``?``.
        signed_headers: lower-case header names, in the order to sign (sorted).
        scope: ``DATE/REGION/SERVICE/aws4_request``.
    """
    canonical = "\n".join(
        [
            method.upper(),
            raw_path or "/",
            canonical_query(raw_query),
            _canonical_headers(headers, signed_headers),
            ";".join(signed_headers),
            payload_hash,
        ]
    )
    to_sign = "\n".join(
        [ALGORITHM, amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    date, region, service, _ = scope.split("/")
    return hmac.new(
        signing_key(secret_key, date, region, service), to_sign.encode(), hashlib.sha256
    ).hexdigest()


def sign_headers(
    method: str,
    url: str,
    *,
    access_key: str,
    secret_key: str,
    headers: Mapping[str, str] | None = None,
    body: bytes = b"",
    payload_hash: str | None = None,
    session_token: str | None = None,
    region: str = "us-east-1",
    service: str = "s3",
    now: _dt.datetime | None = None,
) -> dict[str, str]:
    """Return ``headers`` plus Host, x-amz-date, x-amz-content-sha256, Authorization.

    The URL's path must already be percent-encoded (e.g. ``quote(key, safe="/~")``).
    Every header passed in is signed. ``payload_hash`` (e.g. :data:`UNSIGNED_PAYLOAD`)
    replaces the SHA-256 of ``body``; ``session_token`` (temporary credentials)
    goes in ``X-Amz-Security-Token``.
    """
    parts = urlsplit(url)
    now = now or _dt.datetime.now(_dt.timezone.utc)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    out = dict(headers or {})
    out.setdefault("Host", parts.netloc)
    out["x-amz-date"] = amz_date
    out["x-amz-content-sha256"] = payload_hash or (hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256)
    if session_token:
        out["X-Amz-Security-Token"] = session_token
    signed = sorted({k.lower() for k in out})
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    sig = signature(
        method=method,
        raw_path=parts.path,
        raw_query=parts.query,
        headers=out,
        signed_headers=signed,
        payload_hash=out["x-amz-content-sha256"],
        amz_date=amz_date,
        scope=scope,
        secret_key=secret_key,
    )
    out["Authorization"] = (
        f"{ALGORITHM} Credential={access_key}/{scope}, "
        f"SignedHeaders={';'.join(signed)}, Signature={sig}"
    )
    return out


def parse_authorization(value: str) -> tuple[str, str, list[str]] | None:
    """Split a SigV4 Authorization header into (access_key, scope, signed_headers)."""
    match = _AUTH_RE.search(value or "")
    if match is None:
        return None
    access_key, _, scope = match["cred"].partition("/")
    return access_key, scope, match["signed"].split(";")


def resign_headers(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    *,
    secret_key: str,
    removed: Iterable[str] = (),
) -> dict[str, str] | None:
    """Re-sign an already signed request after dropping the headers in ``removed``.

    Returns the new header dict (without the removed headers), or None when the
    request is not SigV4 header-signed (anonymous or presigned), in which case
    the caller forwards it unchanged.
    """
    auth = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
    parsed = parse_authorization(auth)
    if parsed is None:
        return None
    access_key, scope, signed = parsed
    drop = {h.lower() for h in removed}
    out = {k: v for k, v in headers.items() if k.lower() not in drop}
    lowered = {k.lower(): v for k, v in out.items()}
    new_signed = [h for h in signed if h not in drop]
    sig = signature(
        method=method,
        raw_path=raw_path,
        raw_query=raw_query,
        headers=out,
        signed_headers=new_signed,
        payload_hash=lowered.get("x-amz-content-sha256", UNSIGNED_PAYLOAD),
        amz_date=lowered.get("x-amz-date", ""),
        scope=scope,
        secret_key=secret_key,
    )
    for key in [k for k in out if k.lower() == "authorization"]:
        del out[key]
    out["Authorization"] = (
        f"{ALGORITHM} Credential={access_key}/{scope}, "
        f"SignedHeaders={';'.join(new_signed)}, Signature={sig}"
    )
    return out
