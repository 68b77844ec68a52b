"""Adversarial consumers against a real daemon and real ``rclone serve s3`` origins with several key sets.

Consumer A has valid keys and opens ``s3://bkt/corpus``. The others try to be
served A's dataset without being able to read it themselves: a wrong secret,
an unknown key, no key at all, anonymous, another endpoint with a bucket of
the same name, or A's plan handle. None may get a blob path, the daemon must
never fetch for them with A's keys, and no secret may show in the daemon's
log, ``/v1/status`` or ``/metrics``. A second, different valid key set is
served, and fetches what it asks for with its own keys: once the origin stops
accepting them, its new reads fail while A's go on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from stager import errors as stager_errors
from stager.config import CacheConfig, FetchConfig, SourceConfig
from stager.daemon import Daemon, DaemonConfig
from stager.daemon_client import manifest_fingerprint
from stager.daemon_client.protocol import CONSUMER_KEY_HEADER
from stager.errors import AccessDenied
from stager.hashing import blob_digest
from stager.session import RemoteSession
from stager.testing.s3server import S3Server
from tests.daemon.node import FAST_RETRY
from tests.daemon.support import Corpus, DaemonProcess, make_corpus, remove_dir, short_dir

URL = "s3://bkt/corpus"
KEY_A = ("akconsumeraaaa01", "skconsumeraaaa0123456789")
KEY_C = ("akconsumercccc01", "skconsumercccc0123456789")
KEY_OTHER = ("akotherendpoint1", "skotherendpoint0123456789")
MALLORY = "mallory-consumer-key-0001"


@dataclass
class Site:
    origin: S3Server  # accepts KEY_A and KEY_C
    other: S3Server  # another endpoint, a bucket of the same name with other data, KEY_OTHER only
    corpus: Corpus
    other_corpus: Corpus
    work: Path
    daemon: Daemon | None = None

    @property
    def socket(self) -> Path:
        return self.work / "d.sock"

    @property
    def cache(self) -> CacheConfig:
        return CacheConfig(directory=self.work / "cache", capacity=1 << 30)

    def options(self, keys: tuple[str, str] | None = KEY_A, server: S3Server | None = None) -> dict[str, Any]:
        options = (server or self.origin).storage_options(keys=keys or ("unused-key-000", "unused-secret-0"))
        if keys is None:
            del options["key"], options["secret"]
        return options

    def session(self) -> RemoteSession:
        return RemoteSession(self.socket, self.cache, FetchConfig(concurrency=4, retry=FAST_RETRY), fallback=False,
                             reconnect_timeout=5.0)

    async def raw(self, method: str, path: str, *, key: str = MALLORY, **kwargs: Any) -> tuple[int, Any]:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(self.socket))) as client:
            async with client.request(method, f"http://stager{path}", headers={CONSUMER_KEY_HEADER: key},
                                      **kwargs) as response:
                return response.status, await response.json(content_type=None)


@pytest.fixture
async def site(tmp_path, s3_server_factory, monkeypatch):
    # Nothing in the daemon's environment may stand in for a consumer's missing keys.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    origin = s3_server_factory(access_key=KEY_A[0], secret_key=KEY_A[1], extra_keys=(KEY_C,))
    other = s3_server_factory(access_key=KEY_OTHER[0], secret_key=KEY_OTHER[1])
    corpus = make_corpus(origin.root / "bkt" / "corpus", shards=6, tokens=20_000, block_size=16 * 1024)
    other_corpus = make_corpus(other.root / "bkt" / "corpus", shards=6, tokens=20_000, block_size=16 * 1024,
                               seed=7)
    work = short_dir()
    (work / "cache").mkdir()
    s = Site(origin, other, corpus, other_corpus, work)
    s.daemon = Daemon(DaemonConfig(socket=s.socket, lease=60.0), s.cache,
                      FetchConfig(concurrency=4, hedge=False, retry=FAST_RETRY))
    await s.daemon.start()
    try:
        yield s
    finally:
        await s.daemon.stop()
        remove_dir(work)


def _plan(site: Site, options: dict[str, Any], order: list[int], fingerprint: str | None = None) -> dict[str, Any]:
    return {"dataset": {"url": URL, "storage_options": options},
            "fingerprint": fingerprint or manifest_fingerprint(site.corpus.manifest), "order": order}


async def _consumer_a(site: Site, order: list[int]):
    session = site.session()
    dataset = await session.open_dataset(SourceConfig(URL, site.options(KEY_A)))
    plan = await session.plan(dataset, order)
    return session, dataset, plan


async def test_consumers_without_keys_that_read_the_dataset_are_refused(site, caplog):
    caplog.set_level(logging.DEBUG)
    session, _, plan = await _consumer_a(site, [0, 1])
    try:
        assert (await plan.ready(0)).name == site.corpus.manifest.digest(0)
        intruders = {
            "wrong secret": site.options((KEY_A[0], "skwrongsecret0123456789")),
            "unknown key": site.options(("NOBODY000000", "NOBODYSECRET0000")),
            "no key": site.options(None),
            "anonymous": {**site.options(None), "anon": True},
        }
        for what, options in intruders.items():
            routes = [
                ("PUT", "/v1/consumers/mallory/plans/p0", _plan(site, options, [1, 2, 3])),
                ("POST", "/v1/datasets", {"dataset": {"url": URL, "storage_options": options}}),
                ("POST", "/v1/blocks/ready", {"dataset": {"url": URL, "storage_options": options}, "index": 4,
                                              "block": 0, "timeout": 2,
                                              "fingerprint": manifest_fingerprint(site.corpus.manifest)}),
                ("POST", "/v1/pin", {"dataset": {"url": URL, "storage_options": options}}),
            ]
            # Without keys the store loads botocore's models each time (seconds): one route says enough.
            for method, path, body in routes if options.get("key") else routes[:1]:
                status, answer = await site.raw(method, path, json=body)
                assert status >= 400 and "path" not in answer, (what, method, path, answer)
                assert options.get("secret", "-") not in str(answer) and KEY_A[1] not in str(answer)
                assert answer["error"]["type"] in stager_errors.__all__, answer
            status, answer = await site.raw("GET", "/v1/consumers/mallory/plans/p0/ready?position=0&timeout=1")
            assert (status, answer["error"]["type"]) == (404, "UnknownPlan"), what
        assert site.daemon.registry.get(session.consumer_id, session.daemon._consumer_key, plan.id)
        assert [r.consumer for r in site.daemon.registry.plans()] == [session.consumer_id]
        # Nothing was fetched for them: no shard beyond what A's own plan prefetches.
        cached = {d for d in (site.corpus.manifest.digest(i) for i in range(6))
                  if site.daemon.cache.record(d) is not None}
        assert cached <= {site.corpus.manifest.digest(0), site.corpus.manifest.digest(1)}
        # And no secret anywhere an operator looks.
        status = str(await site.daemon.status())
        metrics = site.daemon.metrics.render(await site.daemon.snapshot())
        for secret in (KEY_A[1], "skwrongsecret0123456789", "NOBODYSECRET0000"):
            assert secret not in caplog.text and secret not in status and secret.encode() not in metrics
    finally:
        await session.close()


async def test_a_bucket_of_the_same_name_on_another_endpoint_is_not_the_same_dataset(site):
    session, _, plan = await _consumer_a(site, [0])
    try:
        assert (await plan.ready(0)).name == site.corpus.manifest.digest(0)
        elsewhere = site.options(KEY_OTHER, server=site.other)
        status, answer = await site.raw("PUT", "/v1/consumers/mallory/plans/p0", json=_plan(site, elsewhere, [0, 1]))
        assert (status, answer["error"]["type"]) == (409, "ManifestVersionGone"), answer
        # With its own manifest it is served its own data, fetched from its own endpoint.
        theirs = manifest_fingerprint(site.other_corpus.manifest)
        status, answer = await site.raw("PUT", "/v1/consumers/mallory/plans/p0",
                                        json=_plan(site, elsewhere, [0, 1], fingerprint=theirs))
        assert status == 200, answer
        status, answer = await site.raw("GET", "/v1/consumers/mallory/plans/p0/ready?position=0&timeout=20")
        assert status == 200 and answer["digest"] == site.other_corpus.manifest.digest(0)
        assert blob_digest(Path(answer["path"]).read_bytes()) == site.other_corpus.manifest.digest(0)
        assert site.other_corpus.manifest.digest(0) != site.corpus.manifest.digest(0)
    finally:
        await session.close()


async def test_another_valid_key_set_is_served_and_fetches_with_its_own_keys(site):
    session_a, _, plan_a = await _consumer_a(site, [0])
    session_c = site.session()
    try:
        assert (await plan_a.ready(0)).name == site.corpus.manifest.digest(0)
        dataset_c = await session_c.open_dataset(SourceConfig(URL, site.options(KEY_C)))
        plan_c = await session_c.plan(dataset_c, [0])
        assert (await plan_c.ready(0)).name == site.corpus.manifest.digest(0), "blobs are shared by digest"
        # The origin stops accepting C's keys (same address, A's keys only).
        port = site.origin.port
        site.origin.stop()
        site.origin.extra_keys, site.origin.fixed_port = (), port
        site.origin.start()
        later_c = await session_c.plan(dataset_c, [4])
        with pytest.raises(AccessDenied):
            await later_c.ready(0)
        later_a = await session_a.plan(await session_a.open_dataset(SourceConfig(URL, site.options(KEY_A))), [4])
        assert (await later_a.ready(0)).name == site.corpus.manifest.digest(4)
    finally:
        await session_c.close()
        await session_a.close()


async def test_a_plan_handle_serves_only_the_consumer_that_registered_it(site):
    session, _, plan = await _consumer_a(site, [2, 3])
    try:
        assert (await plan.ready(0)).name == site.corpus.manifest.digest(2)
        listed = (await site.daemon.status())["plans"]
        assert [p["consumer"] for p in listed] == [session.consumer_id]
        path = f"/v1/consumers/{session.consumer_id}/plans/{plan.id}"
        replace = _plan(site, site.options(("NOBODY000000", "x" * 16)), [0])
        for method, suffix, kwargs in [("GET", "/ready?position=1&timeout=1", {}),
                                       ("POST", "/advance", {"json": {"position": 2}}),
                                       ("PUT", "", {"json": replace}), ("DELETE", "", {})]:
            status, answer = await site.raw(method, path + suffix, **kwargs)
            assert (status, answer["error"]["type"]) == (403, "ConsumerKeyMismatch"), (method, suffix, answer)
        status, answer = await site.raw("DELETE", f"/v1/consumers/{session.consumer_id}")
        assert status == 403
        status, answer = await site.raw("POST", f"/v1/consumers/{session.consumer_id}/heartbeat")
        assert status == 403
        assert (await plan.ready(1)).name == site.corpus.manifest.digest(3), "A's plan is untouched"
        assert plan.cursor == 0 and site.daemon.registry.plans()[0].plan.cursor == 0
    finally:
        await session.close()


class _VerboseDaemon(DaemonProcess):
    def command(self) -> list[str]:
        command = super().command()
        return [*command[:3], "-vv", *command[3:]]  # python -m stager -vv serve ...


async def test_a_real_stager_serve_refuses_a_wrong_key_and_logs_no_secret(site):
    """The same refusal from ``python -m stager serve`` in a process of its own, with its real log."""
    await site.daemon.stop()
    daemon = _VerboseDaemon(site.socket, site.work / "cache").start()
    session = site.session()
    try:
        dataset = await session.open_dataset(SourceConfig(URL, site.options(KEY_A)))
        plan = await session.plan(dataset, [0, 1])
        assert (await plan.ready(1)).name == site.corpus.manifest.digest(1)
        wrong = site.options((KEY_A[0], "skwrongsecret0123456789"))
        status, answer = await site.raw("PUT", "/v1/consumers/mallory/plans/p0", json=_plan(site, wrong, [2]))
        assert (status, answer["error"]["type"]) == (502, "AccessDenied"), answer
        status, answer = await site.raw("GET", "/v1/consumers/mallory/plans/p0/ready?position=0&timeout=1")
        assert status == 404
        await session.close()
        daemon.stop()
        log = daemon.output()
        assert "opened dataset s3://bkt/corpus" in log and "refused dataset s3://bkt/corpus" in log, log
        for secret in (KEY_A[1], "skwrongsecret0123456789"):
            assert secret not in log
    finally:
        await session.close()
        daemon.kill()
