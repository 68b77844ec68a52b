"""pytest fixtures: real origins and the fault proxy on loopback.

How it works: every fixture that starts something yields it and stops it in a
``finally`` at teardown, so servers, threads and rclone processes go away even
when the test fails. Factories keep a list of what they started and stop all
of it, newest first (proxies before the origins they front).

* ``s3_server_session``: one rclone S3 server for the whole session.
* ``s3_bucket``: a fresh, empty bucket on that server per test (fast: one
  CreateBucket), as an `S3Bucket`.
* ``s3_server``: a private rclone S3 server per test (about 0.1 s to start);
  use it when the test stops, restarts or corrupts the server.
* ``s3_server_factory(**kwargs)``: more independent servers, each with its
  own root and, unless given, its own random keys.
* ``http_origin``: an `HttpOrigin` serving a fresh ``tmp_path/"http"``.
* ``http_origin_factory(root=None, listing=True)``: more HTTP origins.
* ``fault_proxy(upstream, plan=None, seed=0, credentials=None)``: a
  `FaultProxy` in front of an S3Server, HttpOrigin, another proxy or a URL
  (an S3Server's keys are passed on so the proxy can re-sign).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from stager.loopback.fault_plan import FaultPlan
from stager.loopback.fault_proxy import FaultProxy
from stager.loopback.http_origin import HttpOrigin
from stager.testing.s3server import S3Bucket, S3Server

_bucket_numbers = itertools.count()


def _stop_all(things: list) -> None:
    errors = []
    for thing in reversed(things):
        try:
            thing.stop()
        except Exception as exc:  # noqa: BLE001 - stop the rest, then report
            errors.append(exc)
    things.clear()
    if errors:
        raise errors[0]


def _random_keys() -> tuple[str, str]:
    return "ak" + secrets.token_hex(8), "sk" + secrets.token_hex(16)


@pytest.fixture(scope="session")
def s3_server_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3-session") / "root")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server_session: S3Server) -> S3Bucket:
    if not s3_server_session.running:  # a test killed it: bring it back
        s3_server_session.start()
    name = f"t{next(_bucket_numbers):05d}-{secrets.token_hex(4)}"
    return S3Bucket(s3_server_session, name, s3_server_session.make_bucket(name))


@pytest.fixture
def s3_server(tmp_path: Path) -> Iterator[S3Server]:
    server = S3Server(tmp_path / "s3" / "root")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., S3Server]]:
    started: list[S3Server] = []

    def make(
        root: Path | None = None,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        **kwargs,
    ) -> S3Server:
        ak, sk = _random_keys()
        server = S3Server(
            root if root is not None else tmp_path_factory.mktemp("s3") / "root",
            access_key=access_key or ak,
            secret_key=secret_key or sk,
            **kwargs,
        )
        started.append(server)
        return server

    try:
        yield make
    finally:
        _stop_all(started)


@pytest.fixture
def http_origin_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., HttpOrigin]]:
    started: list[HttpOrigin] = []

    def make(root: Path | None = None, *, listing: bool = True) -> HttpOrigin:
        origin = HttpOrigin(
            root if root is not None else tmp_path_factory.mktemp("http"), listing=listing
        )
        started.append(origin)
        return origin

    try:
        yield make
    finally:
        _stop_all(started)


@pytest.fixture
def http_origin(http_origin_factory: Callable[..., HttpOrigin], tmp_path: Path) -> HttpOrigin:
    return http_origin_factory(tmp_path / "http")


@pytest.fixture
def fault_proxy() -> Iterator[Callable[..., FaultProxy]]:
    started: list[FaultProxy] = []

    def make(
        upstream: S3Server | S3Bucket | HttpOrigin | FaultProxy | str,
        plan: FaultPlan | None = None,
        seed: int = 0,
        credentials: Mapping[str, str] | None = None,
    ) -> FaultProxy:
        if isinstance(upstream, S3Bucket):
            upstream = upstream.server
        if isinstance(upstream, S3Server):
            url = upstream.endpoint_url
            credentials = {**upstream.credentials, **(credentials or {})}
        elif isinstance(upstream, (HttpOrigin, FaultProxy)):
            url = upstream.url
        else:
            url = str(upstream)
        proxy = FaultProxy(url, plan, seed=seed, credentials=credentials)
        started.append(proxy)
        return proxy

    try:
        yield make
    finally:
        _stop_all(started)
