"""Tests of the test harness itself: each origin and each fault must be real.

Every assertion here is about what a client actually observes on the wire, so
a harness that silently stops injecting a fault (or an origin that stops
honouring ranges) fails these tests rather than making other suites pass
vacuously.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import os
import random
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import psutil
import pytest
import s3fs

from stager.store import sigv4
from stager.testing import s3server
from stager.loopback.fault_plan import FaultPlan
from stager.loopback.fault_proxy import FaultProxy
from stager.loopback.http_origin import HttpOrigin, parse_range
from stager.testing.s3server import S3Server

pytestmark = pytest.mark.timeout(60)

BLOB = random.Random(1234).randbytes(256 * 1024)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


def fetch(url: str, method: str = "GET", headers: dict | None = None) -> Reply:
    """One request on a fresh connection; transport errors propagate."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""),
                     headers=headers or {})
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def s3(storage_options: dict) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(**storage_options, skip_instance_cache=True)


@pytest.fixture
def origin(http_origin: HttpOrigin) -> HttpOrigin:
    (http_origin.root / "blob.bin").write_bytes(BLOB)
    (http_origin.root / "other.bin").write_bytes(b"other")
    return http_origin


# -- S3 server -------------------------------------------------------------------


def test_s3fs_write_list_read_ranges(s3_bucket):
    fs = s3(s3_bucket.storage_options())
    name = s3_bucket.name
    fs.pipe(f"{name}/dir/a.bin", BLOB)
    (s3_bucket.path / "dir" / "disk.bin").write_bytes(b"written on disk")  # after start
    assert sorted(fs.find(name)) == [f"{name}/dir/a.bin", f"{name}/dir/disk.bin"]
    assert fs.ls(name, detail=False) == [f"{name}/dir"]
    assert fs.cat_file(f"{name}/dir/a.bin", start=1000, end=1010) == BLOB[1000:1010]
    assert fs.cat(f"{name}/dir/disk.bin") == b"written on disk"
    info = fs.info(f"{name}/dir/a.bin")
    assert info["size"] == len(BLOB)
    assert info["ETag"].strip('"') == hashlib.md5(BLOB).hexdigest()
    with fs.open(f"{name}/dir/a.bin", "rb", block_size=64 * 1024) as f:
        f.seek(200_000)
        assert f.read(100) == BLOB[200_000:200_100]
    assert (s3_bucket.path / "dir" / "a.bin").read_bytes() == BLOB


def test_bucket_folder_created_on_disk_is_visible(s3_server):
    fs = s3(s3_server.storage_options())
    assert fs.ls("", detail=False) == []  # rclone has now listed (and could cache) root
    (s3_server.root / "late-bucket" / "k").mkdir(parents=True)
    (s3_server.root / "late-bucket" / "k" / "x.bin").write_bytes(b"xyz")
    fs.invalidate_cache()  # s3fs caches listings on the client side too
    assert "late-bucket" in fs.ls("", detail=False)
    assert fs.cat("late-bucket/k/x.bin") == b"xyz"
    assert s3_server.make_bucket("api-bucket") == s3_server.root / "api-bucket"


def test_second_server_rejects_first_servers_keys(s3_server_factory):
    first, second = s3_server_factory(), s3_server_factory()
    assert first.access_key != second.access_key
    for server in (first, second):
        server.make_bucket("shared")
        server.put_object("shared", "k", b"v")
    wrong = s3(first.storage_options(endpoint_url=second.endpoint_url))
    with pytest.raises(PermissionError):
        wrong.cat("shared/k")
    url = second.endpoint_url + "/shared/k"
    headers = sigv4.sign_headers("GET", url, access_key=first.access_key,
                                 secret_key=first.secret_key)
    assert fetch(url, headers=headers).status == 403
    assert s3(second.storage_options()).cat("shared/k") == b"v"


def test_env_configures_a_subprocess_client(s3_bucket):
    s3_bucket.server.put_object(s3_bucket.name, "k.bin", BLOB)  # stored with a CRC32
    code = ("import sys, s3fs; fs = s3fs.S3FileSystem(skip_instance_cache=True); "
            "sys.stdout.write(fs.cat_file(sys.argv[1], start=7, end=12).hex())")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    result = subprocess.run([sys.executable, "-c", code, f"{s3_bucket.name}/k.bin"],
                            env={**env, **s3_bucket.env()}, capture_output=True, text=True,
                            timeout=60)
    assert result.stdout == BLOB[7:12].hex(), result.stderr


def test_s3_server_retries_when_its_port_is_taken(tmp_path, monkeypatch):
    intruder = socket.create_server(("127.0.0.1", 0))
    ports = iter([intruder.getsockname()[1], s3server.free_port()])
    monkeypatch.setattr(s3server, "free_port", lambda: next(ports))
    with intruder, S3Server(tmp_path / "root") as server:
        assert server.port != intruder.getsockname()[1]
        assert server.make_bucket("after-retry").is_dir()


def test_s3_server_stop_kills_the_process(tmp_path):
    with S3Server(tmp_path / "root") as server:
        pid, port = server.pid, server.port
        assert psutil.pid_exists(pid)
    assert not psutil.pid_exists(pid)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


# -- HTTP origin -----------------------------------------------------------------


def test_http_origin_range_semantics(origin):
    url = origin.url_for("blob.bin")
    size = len(BLOB)
    head = fetch(url, "HEAD")
    assert (head.status, head.body, head.headers["content-length"]) == (200, b"", str(size))
    assert head.headers["accept-ranges"] == "bytes"
    assert parsedate_to_datetime(head.headers["last-modified"]).timestamp() > 0
    assert fetch(url).body == BLOB
    cases = {
        "bytes=10-19": (10, 19),
        "bytes=262100-999999": (262100, size - 1),
        "bytes=-16": (size - 16, size - 1),
        "bytes=262000-": (262000, size - 1),
    }
    for header, (start, end) in cases.items():
        reply = fetch(url, headers={"Range": header})
        assert reply.status == 206, header
        assert reply.headers["content-range"] == f"bytes {start}-{end}/{size}"
        assert reply.body == BLOB[start : end + 1]
    for header in (f"bytes={size}-", f"bytes={size + 5}-{size + 9}", "bytes=-0"):
        reply = fetch(url, headers={"Range": header})
        assert (reply.status, reply.headers["content-range"]) == (416, f"bytes */{size}")
    for header in ("bytes=0-1,5-6", "items=0-1", "bytes=9-2"):
        assert fetch(url, headers={"Range": header}).status == 200
    assert fetch(origin.url_for("missing.bin")).status == 404
    assert fetch(url, "PUT").status == 405
    assert parse_range("bytes=0-0", 0) == "unsatisfiable"


def test_http_origin_refuses_path_traversal(origin, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    (origin.root / "escape").symlink_to(secret)
    assert fetch(origin.url_for("escape")).status == 403
    for target in (b"/../secret.txt", b"/%2e%2e/secret.txt", b"/x/..%2f..%2fsecret.txt"):
        with socket.create_connection(("127.0.0.1", origin.port), timeout=5) as sock:
            sock.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b"".join(iter(lambda: sock.recv(65536), b""))
        assert answer.split(b" ")[1] in (b"403", b"404"), answer[:100]
        assert b"top secret" not in answer


async def test_http_origin_serves_async_clients_and_subprocesses(origin):
    async with aiohttp.ClientSession() as session:
        async with session.get(origin.url_for("blob.bin"), headers={"Range": "bytes=5-9"}) as r:
            assert (r.status, await r.read()) == (206, BLOB[5:10])
    code = "import sys, urllib.request; print(len(urllib.request.urlopen(sys.argv[1]).read()))"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, origin.url_for("blob.bin"), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert int(out) == len(BLOB)


def test_http_origin_directory_listing(origin):
    body = fetch(origin.url + "/").body.decode()
    assert 'href="/blob.bin"' in body and 'href="/other.bin"' in body
    assert [r.path for r in origin.requests][-1] == "/"


# -- fault proxy: pass-through and each fault ------------------------------------


def test_proxy_passes_requests_through(origin, fault_proxy):
    proxy = fault_proxy(origin)
    assert fetch(proxy.url + "/blob.bin").body == BLOB
    head = fetch(proxy.url + "/blob.bin", "HEAD")
    assert (head.status, head.headers["content-length"], head.body) == (200, str(len(BLOB)), b"")
    part = fetch(proxy.url + "/blob.bin", headers={"Range": "bytes=100-199"})
    assert (part.status, part.headers["content-range"], part.body) == (
        206, f"bytes 100-199/{len(BLOB)}", BLOB[100:200])
    assert fetch(proxy.url + "/nope").status == 404
    stats = proxy.stats()
    assert (stats.requests, stats.faults) == (4, {})
    assert stats.bytes_down >= len(BLOB) + 100


def test_proxy_slowdown_and_500(origin, fault_proxy):
    proxy = fault_proxy(origin, FaultPlan(slowdown_p=1.0))
    reply = fetch(proxy.url + "/blob.bin")
    assert reply.status == 503 and b"<Code>SlowDown</Code>" in reply.body
    assert fetch(proxy.url + "/blob.bin", "HEAD").status == 200  # only GET by default
    proxy.update(slowdown_p=0.0, error500_p=1.0)
    reply = fetch(proxy.url + "/blob.bin")
    assert reply.status == 500 and b"<Code>InternalError</Code>" in reply.body
    assert proxy.faults == {"slowdown": 1, "error500": 1}


async def test_proxy_reset_raises(origin, fault_proxy):
    proxy = fault_proxy(origin, FaultPlan(reset_p=1.0))
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.get(proxy.url + "/blob.bin") as r:
                await r.read()
    with pytest.raises(ConnectionResetError):
        await asyncio.to_thread(fetch, proxy.url + "/blob.bin")
    assert proxy.faults == {"reset": 2}


async def test_proxy_truncates_body(origin, fault_proxy):
    proxy = fault_proxy(origin, FaultPlan(truncate_p=1.0))
    with pytest.raises(http.client.IncompleteRead) as info:
        await asyncio.to_thread(fetch, proxy.url + "/blob.bin")
    assert len(info.value.partial) < len(BLOB)
    assert BLOB.startswith(info.value.partial)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientPayloadError):
            async with session.get(proxy.url + "/blob.bin") as r:
                assert r.content_length == len(BLOB)
                await r.read()
    assert proxy.faults == {"truncate": 2}


def test_proxy_flips_exactly_one_byte(origin, fault_proxy):
    proxy = fault_proxy(origin, FaultPlan(flip_p=1.0))
    body = fetch(proxy.url + "/blob.bin").body
    assert len(body) == len(BLOB)
    diffs = [i for i, (a, b) in enumerate(zip(body, BLOB)) if a != b]
    assert len(diffs) == 1 and body[diffs[0]] == BLOB[diffs[0]] ^ 0xFF
    part = fetch(proxy.url + "/blob.bin", headers={"Range": "bytes=0-99"}).body
    assert len(part) == 100 and sum(a != b for a, b in zip(part, BLOB)) == 1


def test_proxy_ignores_range(origin, fault_proxy):
    proxy = fault_proxy(origin, FaultPlan(ignore_range_p=1.0))
    reply = fetch(proxy.url + "/blob.bin", headers={"Range": "bytes=100-199"})
    assert (reply.status, reply.body) == (200, BLOB)
    assert fetch(proxy.url + "/other.bin").body == b"other"  # no Range: nothing to ignore
    assert proxy.faults == {"ignore_range": 1}


def test_proxy_bandwidth_cap_slows_transfers(origin, fault_proxy):
    proxy = fault_proxy(origin)
    start = time.monotonic()
    fetch(proxy.url + "/blob.bin")
    uncapped = time.monotonic() - start
    rate = 1024 * 1024  # 256 KiB at 1 MiB/s: 0.25 s
    proxy.update(bandwidth_bps=rate)
    start = time.monotonic()
    assert fetch(proxy.url + "/blob.bin").body == BLOB
    capped = time.monotonic() - start
    assert capped >= 0.6 * len(BLOB) / rate and capped >= 3 * uncapped
    assert capped < 10 * len(BLOB) / rate
    # Shared across connections: two parallel halves take as long as the whole.
    start = time.monotonic()
    halves = [{"Range": "bytes=0-131071"}, {"Range": "bytes=131072-"}]
    threads = [threading.Thread(target=fetch, args=(proxy.url + "/blob.bin", "GET", h))
               for h in halves]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert time.monotonic() - start >= 0.6 * len(BLOB) / rate


def test_proxy_latency_and_spikes(origin, fault_proxy):
    proxy = fault_proxy(origin, FaultPlan(latency_s=0.15))
    start = time.monotonic()
    fetch(proxy.url + "/other.bin")
    assert time.monotonic() - start >= 0.15
    proxy.update(latency_s=0.0, spike_p=1.0, spike_s=0.2)
    start = time.monotonic()
    fetch(proxy.url + "/other.bin")
    assert time.monotonic() - start >= 0.2
    assert proxy.faults == {"spike": 1}


def test_proxy_down_modes(origin, fault_proxy):
    proxy = fault_proxy(origin)
    url = proxy.url + "/other.bin"
    proxy.set_down(True, "503")
    assert fetch(url).status == 503 and fetch(url, "HEAD").status == 503
    proxy.set_down(True, "reset")
    with pytest.raises(ConnectionError):
        fetch(url)
    proxy.set_down(True, "refuse")
    with pytest.raises(ConnectionRefusedError):
        fetch(url)
    proxy.set_down(False)
    assert fetch(url).status == 200
    proxy.plan.down = True  # direct mutation works too
    assert fetch(url).status == 503
    proxy.plan.down = False
    assert fetch(url).status == 200
    assert proxy.faults == {"down": 4}


def test_proxy_filters_and_max_faults(origin, fault_proxy):
    proxy = fault_proxy(origin, FaultPlan(slowdown_p=1.0, path_contains="blob"))
    assert fetch(proxy.url + "/other.bin").status == 200
    assert fetch(proxy.url + "/blob.bin").status == 503
    proxy.update(path_contains=None, path_regex=r"^/oth")
    assert fetch(proxy.url + "/blob.bin").status == 200
    assert fetch(proxy.url + "/other.bin").status == 503
    proxy.update(path_regex=None, methods=None)
    assert fetch(proxy.url + "/other.bin", "HEAD").status == 503
    proxy.update(methods=("GET",), max_faults=4)  # 2 injected so far + 1 HEAD above
    statuses = [fetch(proxy.url + "/other.bin").status for _ in range(3)]
    assert statuses == [503, 200, 200]
    assert proxy.stats().total_faults == 4


def test_proxy_determinism(origin, fault_proxy):
    plan = dict(slowdown_p=0.2, error500_p=0.1, flip_p=0.1, truncate_p=0.1, spike_p=0.3,
                spike_s=0.0)

    def run(proxy: FaultProxy) -> list:
        outcomes = []
        for _ in range(30):
            try:
                reply = fetch(proxy.url + "/other.bin")
                outcomes.append((reply.status, reply.body))
            except http.client.IncompleteRead as exc:
                outcomes.append(("short", exc.partial))
        return outcomes

    first, second, other = (fault_proxy(origin, FaultPlan(**plan), seed=s) for s in (7, 7, 8))
    outcomes = run(first)
    kinds = [e.faults for e in first.events]
    assert len({k for f in kinds for k in f}) >= 3 and () in kinds  # a real mix
    assert run(second) == outcomes and [e.faults for e in second.events] == kinds
    run(other)
    assert [e.faults for e in other.events] != kinds
    other.reseed(7)
    assert run(other) == outcomes


def test_fault_plan_validation(origin, fault_proxy):
    with pytest.raises(ValueError):
        FaultPlan(slowdown_p=0.6, reset_p=0.6)
    with pytest.raises(ValueError):
        FaultPlan(down_mode="maybe")
    proxy = fault_proxy(origin)
    with pytest.raises(ValueError):
        proxy.update(flip_p=2.0)
    with pytest.raises(ValueError):
        proxy.update(nonsense=1)
    assert proxy.plan == FaultPlan()


# -- fault proxy in front of S3 ----------------------------------------------------


def test_sigv4_clients_work_through_the_proxy(s3_bucket, fault_proxy):
    proxy = fault_proxy(s3_bucket)
    fs = s3(s3_bucket.storage_options(endpoint_url=proxy.url))
    key = f"{s3_bucket.name}/dir/with space+plus.bin"
    fs.pipe(key, BLOB)
    assert fs.ls(f"{s3_bucket.name}/dir", detail=False) == [key]
    assert fs.info(key)["size"] == len(BLOB)
    assert fs.cat_file(key, start=5, end=50) == BLOB[5:50]
    assert proxy.stats().bytes_up >= len(BLOB)
    proxy.update(slowdown_p=1.0, max_faults=1)  # the client's retry must get through
    assert fs.cat(key) == BLOB
    assert proxy.faults == {"slowdown": 1}
    fs.rm(key)
    assert not (s3_bucket.path / "dir" / "with space+plus.bin").exists()


def test_proxy_ignores_range_on_s3_by_resigning(s3_bucket, fault_proxy):
    s3_bucket.server.put_object(s3_bucket.name, "blob.bin", BLOB)
    key = f"{s3_bucket.name}/blob.bin"
    proxy = fault_proxy(s3_bucket, FaultPlan(ignore_range_p=1.0))
    fs = s3(s3_bucket.storage_options(endpoint_url=proxy.url))
    assert fs.cat_file(key, start=10, end=20) == BLOB  # whole object, status 200
    assert proxy.faults == {"ignore_range": 1}
    # Without the server's secret the proxy cannot re-sign, so it does not inject.
    blind = fault_proxy(s3_bucket.server.endpoint_url, FaultPlan(ignore_range_p=1.0))
    fs = s3(s3_bucket.storage_options(endpoint_url=blind.url))
    assert fs.cat_file(key, start=10, end=20) == BLOB[10:20]
    assert blind.faults == {}


def test_proxy_threads_stop(origin):
    proxy = FaultProxy(origin.url)
    port = proxy.port
    assert proxy.running
    proxy.stop()
    assert not proxy.running
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


@pytest.mark.timeout(120)
def test_fixtures_clean_up_after_a_failing_test(tmp_path):
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.harness.fixtures"]\n')
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(f"""
        import json, pathlib, socket, psutil, pytest
        STATE = pathlib.Path({str(tmp_path / "state.json")!r})

        def test_a_fails(s3_server, http_origin, fault_proxy):
            proxy = fault_proxy(s3_server)
            STATE.write_text(json.dumps([s3_server.pid, http_origin.port, proxy.port]))
            assert False, "deliberate"

        def test_b_sees_nothing_left():
            pid, *ports = json.loads(STATE.read_text())
            assert not psutil.pid_exists(pid)
            for port in ports:
                with pytest.raises(ConnectionRefusedError):
                    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    """))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "no:hypothesispytest",  # its import alone takes seconds
         "-o", "asyncio_default_fixture_loop_scope=function",
         # Its own temp root: a numbered one would also prune other runs' dirs.
         "--basetemp", str(tmp_path / "inner-tmp"),
         # A hang inside prints every thread's stack into `result` below.
         "--timeout", "60", "--timeout-method", "thread",
         "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path,
    )
    assert "1 failed, 1 passed" in result.stdout, result.stdout + result.stderr


def test_a_sigkilled_test_process_takes_its_rclone_server_with_it(tmp_path):
    script = textwrap.dedent(f"""
        import sys, threading, time
        from stager.testing.s3server import S3Server
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        server = S3Server({str(tmp_path / "root")!r})
        print(server.pid, flush=True)
        time.sleep(60)
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                             text=True, env=env)
    try:
        rclone_pid = int(owner.stdout.readline())
        assert psutil.pid_exists(rclone_pid)
        rclone = psutil.Process(rclone_pid)
    finally:
        owner.kill()
        owner.wait(timeout=10)
    try:
        rclone.wait(timeout=20)
    except psutil.TimeoutExpired:
        rclone.kill()
        pytest.fail("rclone outlived the process that started it")
