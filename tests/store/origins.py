"""Build a store over each origin kind of the test harness, plus a way to put objects behind its back."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from stager.config import RetryConfig, SourceConfig
from stager.store import Store, open_store
from tests.harness.fixtures import S3Bucket

#: Quick backoff so retries cost little; timeouts generous because test machines are shared and busy.
FAST_RETRY = RetryConfig(attempts=10, backoff_base=0.005, backoff_max=0.05, deadline=60.0, request_timeout=15.0)
ORIGIN_KINDS = ("path", "file", "http", "s3")


@dataclass
class Origin:
    """An origin of one kind: a store on it, and ``put(rel, data)`` that writes around the store."""

    kind: str
    store: Store
    put: Callable[[str, bytes], None]
    writable: bool
    listable: bool


def _put_file(root: Path) -> Callable[[str, bytes], None]:
    def put(rel: str, data: bytes) -> None:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)

    return put


def make_origin(
    kind: str, request, tmp_path: Path, *, retry: RetryConfig = FAST_RETRY, via_proxy=None, private: bool = False
) -> Origin:
    """The ``kind`` origin; ``via_proxy(upstream)`` returns a URL to reach it through (HTTP and S3 only).

    ``private``: S3 on a server of its own rather than a bucket of the session's
    server, for tests after which rclone may be left busy (multipart uploads).
    """
    if kind == "path":
        root = tmp_path / "local"
        return Origin(kind, open_store(SourceConfig(str(root)), retry=retry), _put_file(root), True, True)
    if kind == "file":
        root = tmp_path / "file url"
        return Origin(kind, open_store(SourceConfig(f"file://{root}"), retry=retry), _put_file(root), True, True)
    if kind == "http":
        origin = request.getfixturevalue("http_origin")
        url = via_proxy(origin) if via_proxy else origin.url
        store = open_store(SourceConfig(url + "/data"), retry=retry)
        return Origin(kind, store, _put_file(origin.root / "data"), False, False)
    if kind == "s3":
        if private:
            server = request.getfixturevalue("s3_server")
            name = "private"
            bucket = S3Bucket(server, name, server.make_bucket(name))
        else:
            bucket = request.getfixturevalue("s3_bucket")
        endpoint = via_proxy(bucket) if via_proxy else None
        options = {**bucket.storage_options(endpoint), "session": request.getfixturevalue("aws_session")}
        store = open_store(SourceConfig(f"{bucket.url}/data", options), retry=retry)

        def put(rel: str, data: bytes) -> None:
            bucket.server.put_object(bucket.name, f"data/{rel}", data)

        return Origin(kind, store, put, True, True)
    raise ValueError(kind)
