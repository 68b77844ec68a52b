"""Request bodies and parameters: untrusted JSON in, typed and checked values out.

Anyone who can open the socket can send anything, so every field is checked
for type, range and size before it reaches the engine, and a bad one is
refused with :class:`~stager.errors.DaemonRequestError` (HTTP 400)
naming the field. Storage options are passed on to the store unchanged (they
may hold credentials) and never appear in an error message.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..config import SourceConfig
from ..daemon_client.protocol import DaemonRequestError
from ..store.base import split_protocol

_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")
_FINGERPRINT_RE = re.compile(r"[0-9a-f]{32}")
MAX_URL = 4096
MAX_NAME = 256
MAX_PLAN = 1 << 31
MAX_STORAGE_OPTIONS = 64 << 10  # bytes of JSON
MAX_DEPTH = 32  # levels of nesting in a body; storage options need a handful
LOCAL_PROTOCOLS = ("file", "local")
#: What a daemon that does not serve local sources reads: remote object stores and web servers only.
#: An allow-list, because fsspec's wrappers (simplecache::, filecache, blockcache, zip, tar, reference,
#: memory, ...) and their target_protocol / fo options can make any other URL read the daemon's disk.
REMOTE_PROTOCOLS = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "http", "https")
#: Storage options that make a filesystem read through another one (fsspec's chaining).
CHAINING_OPTIONS = frozenset({"target_protocol", "target_options", "fo", "remote_protocol", "remote_options",
                              "protocol", "fs"})
_KEY_RE = re.compile(r"[A-Za-z0-9_-]{16,128}")


def parse_json(raw: bytes) -> dict[str, Any]:
    """A request body: a JSON object nested at most :data:`MAX_DEPTH` levels deep."""
    if not raw:
        raise DaemonRequestError("the request needs a JSON object as its body")
    try:
        value = json.loads(raw)
    except RecursionError:  # json recurses once per level: a body nested thousands deep
        raise DaemonRequestError(f"the body nests deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise DaemonRequestError(f"the body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise DaemonRequestError("the body must be a JSON object")
    if _depth_exceeds(value, MAX_DEPTH):
        raise DaemonRequestError(f"the body nests deeper than {MAX_DEPTH} levels")
    return value


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests deeper than ``limit`` (iterative: no recursion to exhaust)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def consumer_key(value: str | None) -> str:
    """The key a consumer sends in ``X-Stager-Consumer-Key`` (16-128 of ``A-Z a-z 0-9 _ -``)."""
    if value is None or not _KEY_RE.fullmatch(value):
        raise DaemonRequestError("X-Stager-Consumer-Key: a consumer's requests need its key, 16-128 letters, "
                                 "digits, _ or - (the consumer makes one at random)")
    return value


def ident(value: Any, what: str) -> str:
    """A consumer or plan id: 1..128 of ``A-Z a-z 0-9 _ . : @ -``, starting alphanumeric."""
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise DaemonRequestError(f"{what}: expected 1-128 characters of letters, digits and _.:@- "
                                 f"(starting with a letter or digit), got {_show(value)}")
    return value


def integer(value: Any, what: str, *, low: int = 0, high: int = 2**62) -> int:
    """An integer in ``[low, high]``; decimal strings are accepted (query parameters)."""
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,19}", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise DaemonRequestError(f"{what}: expected an integer, got {_show(value)}")
    if not low <= value <= high:
        raise DaemonRequestError(f"{what}: {value} is outside {low}..{high}")
    return value


def seconds(value: Any, what: str, *, high: float) -> float:
    """A positive number of seconds, at most ``high``."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise DaemonRequestError(f"{what}: expected seconds, got {_show(value)}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise DaemonRequestError(f"{what}: expected a positive number of seconds, got {_show(value)}")
    return min(float(value), high)


def text(value: Any, what: str, *, limit: int = MAX_NAME, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > limit or not value.isprintable():
        raise DaemonRequestError(f"{what}: expected printable text of 1-{limit} characters")
    return value


def fingerprint(value: Any, what: str = "fingerprint") -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _FINGERPRINT_RE.fullmatch(value):
        raise DaemonRequestError(f"{what}: expected 32 lowercase hex digits, got {_show(value)}")
    return value


def source(value: Any, *, local_sources: bool) -> SourceConfig:
    """A dataset source ``{"url": ..., "storage_options": {...}}``.

    A local path must be absolute (the daemon's working directory is not the
    consumer's), and is refused when the daemon does not serve local sources.
    """
    if not isinstance(value, dict):
        raise DaemonRequestError("dataset: expected an object with a url and optional storage_options")
    unknown = set(value) - {"url", "storage_options"}
    if unknown:
        raise DaemonRequestError(f"dataset: unknown fields {sorted(unknown)}")
    url = value.get("url")
    if not isinstance(url, str) or not url or len(url) > MAX_URL or not url.isprintable():
        raise DaemonRequestError(f"dataset.url: expected a printable URL or path of 1-{MAX_URL} characters")
    protocol, path = split_protocol(url)
    protocol = (protocol or "file").lower()
    if protocol in LOCAL_PROTOCOLS:
        if not local_sources:
            raise DaemonRequestError(f"dataset.url {url!r}: this daemon does not serve local paths "
                                     "(local_sources = false)")
        if not os.path.isabs(path):
            raise DaemonRequestError(f"dataset.url {url!r}: a local path must be absolute")
    options = value.get("storage_options")
    options = {} if options is None else options
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise DaemonRequestError("dataset.storage_options: expected an object with string keys")
    if len(json.dumps(options)) > MAX_STORAGE_OPTIONS:
        raise DaemonRequestError(f"dataset.storage_options: larger than {MAX_STORAGE_OPTIONS} bytes")
    if not local_sources:
        _remote_only(url, protocol, options)
    return SourceConfig(url=url, storage_options=options)


def _remote_only(url: str, protocol: str, options: Mapping[str, Any]) -> None:
    """Refuse a source that could end up reading the daemon's own disk: one protocol, from the allow-list,
    nothing chained (``a::b``) and no option that names another filesystem to read through."""
    if "::" in url or protocol not in REMOTE_PROTOCOLS:
        raise DaemonRequestError(f"dataset.url {url!r}: this daemon serves only {', '.join(REMOTE_PROTOCOLS)} "
                                 f"URLs, without chaining (local_sources = false)")
    chained = sorted(CHAINING_OPTIONS & {k.lower() for k in options})
    if chained:
        raise DaemonRequestError(f"dataset.storage_options: {', '.join(chained)} would read through another "
                                 "filesystem; this daemon serves only remote stores (local_sources = false)")


def order(body: Mapping[str, Any], shards: int) -> np.ndarray | None:
    """A plan's order: ``order`` (a list of shard indexes), ``order_b64`` (base64 of
    little-endian int64) or neither (manifest order). Every index must be in ``0..shards-1``."""
    listed, packed = body.get("order"), body.get("order_b64")
    if listed is not None and packed is not None:
        raise DaemonRequestError("give order or order_b64, not both")
    if listed is None and packed is None:
        return None
    if packed is not None:
        if not isinstance(packed, str):
            raise DaemonRequestError("order_b64: expected a base64 string")
        try:
            raw = base64.b64decode(packed, validate=True)
        except (binascii.Error, ValueError):
            raise DaemonRequestError("order_b64: not valid base64") from None
        if len(raw) % 8:
            raise DaemonRequestError(f"order_b64: {len(raw)} bytes is not a whole number of int64 values")
        result = np.frombuffer(raw, dtype="<i8").astype(np.int64)
    else:
        if not isinstance(listed, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in listed):
            raise DaemonRequestError("order: expected a list of shard indexes (integers)")
        try:
            result = np.asarray(listed, dtype=np.int64)
        except OverflowError:
            raise DaemonRequestError("order: an index does not fit in 64 bits") from None
    if len(result) > MAX_PLAN:
        raise DaemonRequestError(f"order: more than {MAX_PLAN} positions")
    if len(result) and (int(result.min()) < 0 or int(result.max()) >= shards):
        bad = int(result[(result < 0) | (result >= shards)][0])
        raise DaemonRequestError(f"order: shard index {bad} is outside the manifest's 0..{shards - 1}")
    return result


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """A consumer's plan registration, checked."""

    source: SourceConfig
    fingerprint: str | None
    order_body: Mapping[str, Any]  # order/order_b64, checked once the manifest is known
    cursor: int
    window_bytes: int | None
    name: str | None
    floor_bytes: int | None = None
    ahead_seconds: float | None = None


#: The most seconds ahead a plan may ask for (a day: past it the byte window decides anyway).
MAX_AHEAD_SECONDS = 86_400.0


def plan_request(body: Mapping[str, Any], *, local_sources: bool) -> PlanRequest:
    unknown = set(body) - {"dataset", "fingerprint", "order", "order_b64", "cursor", "window_bytes", "name",
                           "floor_bytes", "ahead_seconds"}
    if unknown:
        raise DaemonRequestError(f"plan: unknown fields {sorted(unknown)}")
    window = body.get("window_bytes")
    floor, ahead = body.get("floor_bytes"), body.get("ahead_seconds")
    return PlanRequest(
        source=source(body.get("dataset"), local_sources=local_sources),
        fingerprint=fingerprint(body.get("fingerprint")),
        order_body={k: body[k] for k in ("order", "order_b64") if k in body},
        cursor=integer(body.get("cursor", 0), "cursor", high=MAX_PLAN),
        window_bytes=None if window is None else integer(window, "window_bytes", low=1),
        name=text(body.get("name"), "name"),
        floor_bytes=None if floor is None else integer(floor, "floor_bytes"),
        ahead_seconds=None if ahead is None else seconds(ahead, "ahead_seconds", high=MAX_AHEAD_SECONDS),
    )


def _show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."
