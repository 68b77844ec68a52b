"""The S3 store: a lean signed path for reads and writes; s3fs for what it cannot sign itself.

Reading is what stager does most, and botocore's per-request machinery
(endpoint rules, parsing, its streaming body) costs more CPU than the bytes
themselves at loopback speeds. So ranged and whole-object reads are plain
GETs (:mod:`stager.store.wire`) signed with :mod:`stager.store.sigv4`, their bodies checked by
:func:`~stager.store.range_body.range_chunks` (streamed into a sink, or read
whole).
``HEAD`` (:meth:`S3Store.info`) takes the same path: one request, where
s3fs's ``info`` adds a listing to tell a missing key from a "directory".
Writes of bytes (``PUT`` of a whole object, ``UploadPart``) take the same
path, sent as ``UNSIGNED-PAYLOAD`` (as S3 clients do over TLS) and without
botocore's ``Expect: 100-continue``: replication sends every byte it reads, and
hashing each body with SHA-256 for the signature doubled the client's CPU per
byte (the bytes were verified against the manifest as they were read; ``stager
replicate --verify`` reads the copy back). Listing, deleting, and starting,
listing, completing and aborting multipart uploads go through s3fs and
aiobotocore, except where the signer is made without botocore (below): then
they are signed requests too (:mod:`.s3_calls`), and a replication between
two such stores never loads botocore at all.

Both paths see the same configuration: the endpoint, region and addressing
style come from the aiobotocore client s3fs builds (so ``endpoint_url`` in
storage options, ``AWS_ENDPOINT_URL``, profiles and config files all apply),
and credentials from the storage options (``key``/``secret``/``token``) or
else the aiobotocore session's provider chain (``AWS_*`` variables, profile,
instance metadata; refreshed as they expire). ``anon=True`` sends unsigned
requests. When the endpoint and the keys are all given outright and no
profile or AWS config file could change them (:func:`_direct_settings`), the
signer is made from them directly, and s3fs, aiobotocore and botocore are
never imported (about 60 MB of memory and a third of a CPU second: most of a
short command's start-up time).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Mapping
from urllib.parse import quote, urlsplit


from ..errors import AccessDenied, ConfigError, ShardNotFound, TransientOriginError
from .base import ObjectInfo, Upload
from .endpoint import check_http_url, shown_url
from .fsspec_store import FsspecStore, vouched_md5
from .http_client import error_from_response, last_modified
from .parts import PartLedger
from .signed_http import SignedHttpStore
from . import sigv4
from .options import StoreOptions
from .translate import translated
from .wire import WireSession

DEFAULT_REGION = "us-east-1"
#: The largest single PUT S3 accepts; larger whole-object writes go through s3fs's multipart path.
MAX_PUT = 5 * 2**30
logger = logging.getLogger(__name__)


class S3Store(SignedHttpStore, FsspecStore):
    """A :class:`~stager.store.base.Store` over ``s3://bucket/prefix``.

    Reads are the HTTP family's (:mod:`stager.store.signed_http`), signed with SigV4; the rest goes
    through s3fs (:class:`~stager.store.fsspec_store.FsspecStore`).

    Args:
        url: ``s3://bucket[/prefix]``.
        storage_options: s3fs options (``endpoint_url``, ``key``, ``secret``, ``client_kwargs``, ...).
        options: retry, bandwidth, stats and concurrency (see :class:`~stager.store.options.StoreOptions`).
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None, *,
                 options: StoreOptions = StoreOptions()) -> None:
        _check_tables(url, storage_options or {})
        given = given_endpoint(storage_options or {})
        if given is not None:
            check_http_url(*given)
        if not url.split("://", 1)[-1].strip("/"):
            raise ConfigError(f"{url}: no bucket in the URL (s3://bucket[/prefix])")
        self._direct = _direct_settings(storage_options or {})
        FsspecStore.__init__(self, url, storage_options, options=options)
        self._wire(options.concurrency)
        self._signer: _Signer | None = None
        self._connect_lock = asyncio.Lock()
        self._models_loaded = False

    @property
    def endpoint(self) -> str:
        """The S3 endpoint as the options or the ``AWS_ENDPOINT_URL*`` variables give it (AWS's own
        otherwise), for messages: a user and password in it shown as ``***``."""
        given = given_endpoint(self._options)
        return shown_url(given[0]) if given is not None else "AWS's default endpoint"

    def _filesystem_class(self) -> type:
        try:
            from s3fs import S3FileSystem
        except ImportError as exc:
            raise ConfigError(f"{self._url_hint()}: S3 support needs the s3 extra (pip install 'stager[s3]')") from exc
        return S3FileSystem

    def _filesystem_is_async(self) -> bool:
        return True

    def _strip_protocol(self, url: str) -> str:
        return url.split("://", 1)[-1].strip("/")

    def _open_filesystem(self) -> None:
        # With everything needed to sign requests at hand (see _direct_settings), s3fs and
        # botocore are loaded only if a listing, a delete or a multipart upload needs them.
        if self._direct is None:
            self._session_of(self.fs)

    @staticmethod
    def _session_of(fs: Any) -> Any:
        if fs.session is None:
            # s3fs would make this on first use; making it now lets _connect parse
            # botocore's model files in a thread rather than on the event loop.
            from aiobotocore.session import AioSession

            fs.session = AioSession(**fs.kwargs)
        return fs.session

    async def _connect(self) -> Any:
        """The aiobotocore client, created once; its model files parsed off the event loop."""
        if not self._models_loaded:
            async with self._connect_lock:
                if not self._models_loaded:
                    await asyncio.to_thread(_preload_models, self._session_of(self.fs))
                    self._models_loaded = True
        with translated(self.url):
            return await self.fs.set_session()

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        await self._connect()
        return await super()._call(method, *args, **kwargs)

    async def _control_client(self) -> Any:
        """What makes listing and multipart calls: signed requests of our own when the keys are given
        outright (botocore is then never loaded), else the aiobotocore client."""
        if self._direct is not None:
            from .s3_calls import DirectClient  # XML and listing code: not loaded by a run that only reads

            return DirectClient(self.session, await self._get_signer())
        return await self._connect()

    async def _get_signer(self) -> _Signer:
        if self._signer is None and self._direct is not None:
            self._signer = _Signer(*self._direct.signer_args())
        if self._signer is None:
            client = await self._connect()
            async with self._connect_lock:
                if self._signer is None:
                    with translated(self.url):
                        self._signer = await _Signer.create(self.fs, client)
        return self._signer

    async def _sign(self, method: str, path: str, headers: dict[str, str]) -> tuple[str, Mapping[str, str]]:
        bucket, key = self._bucket_key(path)
        signer = await self._get_signer()
        return await signer.sign(method, bucket, key, headers)

    async def info(self, path: str) -> ObjectInfo:
        bucket, key = self._bucket_key(path)

        async def attempt() -> ObjectInfo:
            signer = await self._get_signer()
            url, headers = await signer.sign("HEAD", bucket, key, {})
            with translated(path):
                async with self.session.head(url, headers=headers) as resp:
                    if resp.status >= 300:
                        raise await error_from_response(resp, path)
                    if resp.content_length is None:
                        raise TransientOriginError(f"{path}: HEAD answer without Content-Length")
                    return ObjectInfo(path, resp.content_length, last_modified(resp),
                                      vouched_md5({"ETag": resp.headers.get("ETag")}))

        return await self.retry.run(attempt, what=path)

    def _bucket_key(self, path: str) -> tuple[str, str]:
        bucket, _, key = self._full(path).partition("/")
        return bucket, key

    async def write(self, path: str, data: bytes) -> None:
        if len(data) > MAX_PUT:
            return await super().write(path, data)
        bucket, key = self._bucket_key(path)

        async def attempt() -> None:
            await self._pace(len(data))
            signer = await self._get_signer()
            url, headers = await signer.sign("PUT", bucket, key, {}, unsigned_payload=True)
            await _put(self.session, url, headers, data, path)

        await self.retry.run(attempt, what=path)
        self.stats.bytes_written += len(data)

    async def open_upload(self, path: str, *, part_size: int) -> Upload:
        bucket, key = self._bucket_key(path)
        ledger = PartLedger(path, part_size)

        async def start() -> str:
            client = await self._control_client()
            with translated(path):
                return (await client.create_multipart_upload(Bucket=bucket, Key=key))["UploadId"]

        upload_id = await self.retry.run(start, what=f"{path} (start upload)")
        return S3Upload(self, path, bucket, key, upload_id, ledger)

    async def resume_upload(self, path: str, *, part_size: int, token: str, parts: Mapping[int, int]) -> Upload:
        bucket, key = self._bucket_key(path)
        ledger = PartLedger(path, part_size)
        what = f"{path} (list upload parts)"
        found: dict[int, tuple[int, str]] = {}
        marker = 0
        while True:  # ListParts pages hold at most 1,000 parts; an upload has at most 10,000
            async def page(marker: int = marker) -> Any:
                client = await self._control_client()
                with translated(what):
                    return await client.list_parts(Bucket=bucket, Key=key, UploadId=token, PartNumberMarker=marker)

            out = await self.retry.run(page, what=what)
            for part in out.get("Parts") or ():
                found[int(part["PartNumber"])] = (int(part["Size"]), part["ETag"])
            next_marker = int(out.get("NextPartNumberMarker") or 0)
            if not out.get("IsTruncated") or next_marker <= marker:
                break
            marker = next_marker
        upload = S3Upload(self, path, bucket, key, token, ledger)
        for number, size in sorted(parts.items()):
            if found.get(number, (None,))[0] != size:
                raise ShardNotFound(f"{path}: upload {token[:24]} lacks part {number} ({size} bytes)")
            ledger.add(number, size)
            upload._etags[number] = found[number][1]
        return upload

    async def list(self) -> list[ObjectInfo]:
        if self._direct is None:
            return await super().list()
        found = [info async for page in self.scan() for info in page]  # signed ListObjectsV2 pages
        found.sort(key=lambda o: o.path)
        return found

    async def delete(self, path: str) -> None:
        if self._direct is None:
            return await super().delete(path)
        bucket, key = self._bucket_key(path)

        async def attempt() -> None:
            client = await self._control_client()
            with translated(path):
                await client.delete_object(Bucket=bucket, Key=key)

        try:
            await self.retry.run(attempt, what=path)
        except ShardNotFound:
            pass

    async def scan(self) -> AsyncIterator[list[ObjectInfo]]:
        # One ListObjectsV2 page (up to 1,000 keys) at a time: s3fs's find() would build
        # a dict per object for the whole listing first.
        bucket, key = self._bucket_key_of_root()
        prefix = f"{key}/" if key else ""
        what = f"{self.url} (list)"
        token: str | None = None
        while True:
            async def page(token: str | None = token) -> Any:
                client = await self._control_client()
                with translated(what):
                    extra = {"ContinuationToken": token} if token else {}
                    return await client.list_objects_v2(Bucket=bucket, Prefix=prefix, **extra)

            out = await self.retry.run(page, what=what)
            found = [
                ObjectInfo(entry["Key"][len(prefix):], int(entry.get("Size") or 0), _timestamp(entry),
                           vouched_md5(entry))
                for entry in out.get("Contents") or ()
                if not entry["Key"].endswith("/") and len(entry["Key"]) > len(prefix)
            ]
            if found:
                yield found
            token = out.get("NextContinuationToken")
            if not out.get("IsTruncated") or not token:
                return

    def _bucket_key_of_root(self) -> tuple[str, str]:
        bucket, _, key = self.root.partition("/")
        return bucket, key.strip("/")

    async def close(self) -> None:
        await self._close_session()
        await super().close()


class S3Upload(Upload):
    """An S3 multipart upload: each part an ``UploadPart``, visible on ``CompleteMultipartUpload``."""

    def __init__(self, store: S3Store, path: str, bucket: str, key: str, upload_id: str, ledger: PartLedger) -> None:
        self._store = store
        self._path = path
        self._bucket = bucket
        self._key = key
        self._upload_id: str | None = upload_id
        self._ledger = ledger
        self._etags: dict[int, str] = {}

    @property
    def token(self) -> str | None:
        return self._upload_id

    def _id(self) -> str:
        if self._upload_id is None:
            raise ValueError(f"{self._path}: upload already completed or aborted")
        return self._upload_id

    async def _call(self, method: str, what: str, **kwargs: Any) -> Any:
        store = self._store

        async def attempt() -> Any:
            client = await store._control_client()
            with translated(what):
                return await getattr(client, method)(Bucket=self._bucket, Key=self._key, **kwargs)

        return await store.retry.run(attempt, what=what)

    async def write_part(self, part_number: int, data: bytes) -> None:
        upload_id = self._id()
        self._ledger.add(part_number, len(data))
        store = self._store
        what = f"{self._path} part {part_number}"
        query = f"partNumber={part_number}&uploadId={quote(upload_id, safe='')}"

        async def attempt() -> str:
            await store._pace(len(data))
            signer = await store._get_signer()
            url, headers = await signer.sign("PUT", self._bucket, self._key, {}, query=query, unsigned_payload=True)
            etag = await _put(store.session, url, headers, data, what)
            if not etag:
                raise TransientOriginError(f"{what}: the answer has no ETag")
            return etag

        self._etags[part_number] = await store.retry.run(attempt, what=what)
        store.stats.bytes_written += len(data)

    async def complete(self) -> None:
        upload_id = self._id()
        size = self._ledger.total()
        if not self._etags:  # S3 wants at least one part: an empty object is a plain PUT
            await self._store.write(self._path, b"")
            await self.abort()
            return
        parts = [{"PartNumber": n, "ETag": self._etags[n]} for n in sorted(self._etags)]
        try:
            await self._call(
                "complete_multipart_upload", f"{self._path} (complete upload)",
                UploadId=upload_id, MultipartUpload={"Parts": parts},
            )
        except ShardNotFound:
            # NoSuchUpload on a retry: the first attempt completed but its answer was lost.
            if (await self._store.info(self._path)).size != size:
                raise
        self._upload_id = None

    async def abort(self) -> None:
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is None:
            return
        try:
            await self._call("abort_multipart_upload", f"{self._path} (abort upload)", UploadId=upload_id)
        except ShardNotFound:
            pass


class _Signer:
    """Builds the URL and SigV4 headers of a request, as the s3fs client would address it."""

    def __init__(
        self, endpoint: str, region: str, credentials: Any, virtual: bool, headers: Mapping[str, str] | None = None
    ) -> None:
        parts = urlsplit(endpoint)
        self.headers = dict(headers or {})  # sent (and signed) with every request
        self.scheme = parts.scheme or "https"
        self.host = parts.netloc
        self.base_path = parts.path.rstrip("/")
        self.region = region
        self.credentials = credentials  # None: unsigned (anonymous)
        self.virtual = virtual

    @classmethod
    async def create(cls, fs: Any, client: Any) -> _Signer:
        endpoint = client.meta.endpoint_url
        region = client.meta.region_name or DEFAULT_REGION
        style = ((fs.config_kwargs or {}).get("s3") or {}).get("addressing_style", "auto")
        host = urlsplit(endpoint).hostname or ""
        virtual = style == "virtual" or (style == "auto" and host.endswith(".amazonaws.com"))
        headers = {"x-amz-request-payer": "requester"} if fs.requester_pays else {}
        return cls(endpoint, region, await _credentials(fs), virtual, headers)

    def url(self, bucket: str, key: str) -> str:
        quoted = quote(key, safe="/~")
        if self.virtual and "." not in bucket:
            return f"{self.scheme}://{bucket}.{self.host}{self.base_path}/{quoted}"
        return f"{self.scheme}://{self.host}{self.base_path}/{bucket}/{quoted}"

    async def sign(self, method: str, bucket: str, key: str, headers: dict[str, str], *, query: str = "",
                   unsigned_payload: bool = False, payload_sha256: str | None = None) -> tuple[str, dict[str, str]]:
        """The URL and headers of a request; ``query`` is already encoded; a body goes as UNSIGNED-PAYLOAD,
        or signed by its ``payload_sha256`` (hex) if given."""
        url = self.url(bucket, key) + (f"?{query}" if query else "")
        if self.headers:
            headers = {**self.headers, **headers}
        if self.credentials is None:
            return url, headers
        frozen = self.credentials.get_frozen_credentials()
        if inspect.isawaitable(frozen):
            frozen = await frozen
        signed = sigv4.sign_headers(
            method, url, access_key=frozen.access_key, secret_key=frozen.secret_key, headers=headers,
            payload_hash=payload_sha256 or (sigv4.UNSIGNED_PAYLOAD if unsigned_payload else sigv4.EMPTY_SHA256),
            session_token=frozen.token, region=self.region)
        return url, signed


@dataclass(frozen=True)
class StaticCredentials:
    """Keys given outright (storage options or ``AWS_*`` variables); the shape of botocore's frozen credentials."""

    access_key: str
    secret_key: str
    token: str | None = None

    def get_frozen_credentials(self) -> StaticCredentials:
        return self


@dataclass(frozen=True)
class _Direct:
    """What signing requests needs, found without botocore (see :func:`_direct_settings`)."""

    endpoint: str
    region: str
    credentials: StaticCredentials | None
    virtual: bool
    headers: Mapping[str, str]

    def signer_args(self) -> tuple[str, str, StaticCredentials | None, bool, Mapping[str, str]]:
        return self.endpoint, self.region, self.credentials, self.virtual, self.headers


#: Storage options whose meaning :func:`_direct_settings` knows; any other one goes through botocore.
_DIRECT_OPTIONS = frozenset({"endpoint_url", "key", "secret", "token", "anon", "client_kwargs", "config_kwargs",
                             "requester_pays", "use_listings_cache", "skip_instance_cache"})
_DIRECT_CLIENT_KWARGS = frozenset({"endpoint_url", "region_name", "aws_access_key_id", "aws_secret_access_key",
                                   "aws_session_token"})
_DIRECT_CONFIG_KWARGS = frozenset({"connect_timeout", "read_timeout", "retries", "s3", "response_checksum_validation",
                                   "request_checksum_calculation"})


def _check_tables(url: str, options: Mapping[str, Any]) -> None:
    """The storage options that hold options of their own are tables (``-o client_kwargs.NAME=VALUE``)."""
    for path in ("client_kwargs", "config_kwargs", "config_kwargs.s3"):
        node: Any = options
        for part in path.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is not None and not isinstance(node, Mapping):
            raise ConfigError(f"{url}: storage option {path} is a table of options (-o {path}.NAME=VALUE), "
                              f"got {node!r}")


def given_endpoint(options: Mapping[str, Any], env: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    """The endpoint the options or the environment give, and the name it was given as (for error
    messages); None for AWS's own. The first given of ``endpoint_url``,
    ``client_kwargs.endpoint_url``, ``AWS_ENDPOINT_URL_S3`` and ``AWS_ENDPOINT_URL`` counts."""
    client_kwargs = options.get("client_kwargs") or {}
    for name, value in (("endpoint_url", options.get("endpoint_url")),
                        ("client_kwargs.endpoint_url", client_kwargs.get("endpoint_url")),
                        ("AWS_ENDPOINT_URL_S3", env.get("AWS_ENDPOINT_URL_S3")),
                        ("AWS_ENDPOINT_URL", env.get("AWS_ENDPOINT_URL"))):
        if value:
            return str(value), name
    return None


def needs_botocore(options: Mapping[str, Any]) -> bool:
    """Whether an S3 store with these storage options needs botocore (to find its endpoint, region or keys);
    if not, it signs every request itself and never loads botocore."""
    return _direct_settings(options) is None


def _direct_settings(options: Mapping[str, Any], env: Mapping[str, str] = os.environ) -> _Direct | None:
    """Endpoint, region, keys and addressing when they are all given outright; None if botocore must find them.

    Given outright means: an endpoint (``endpoint_url`` or ``AWS_ENDPOINT_URL_S3`` /
    ``AWS_ENDPOINT_URL``), keys (``key``/``secret`` or ``AWS_ACCESS_KEY_ID`` /
    ``AWS_SECRET_ACCESS_KEY``, or ``anon``), no profile and no AWS config file
    (which could change the region or the addressing), and no option this
    function does not know. The region is then ``region_name``, ``AWS_REGION``
    or ``AWS_DEFAULT_REGION``, else us-east-1, as botocore would find it.
    """
    if set(options) - _DIRECT_OPTIONS or options.get("profile") or env.get("AWS_PROFILE") \
            or env.get("AWS_DEFAULT_PROFILE"):
        return None
    client_kwargs = dict(options.get("client_kwargs") or {})
    config_kwargs = dict(options.get("config_kwargs") or {})
    s3_config = dict(config_kwargs.get("s3") or {})
    if set(client_kwargs) - _DIRECT_CLIENT_KWARGS or set(config_kwargs) - _DIRECT_CONFIG_KWARGS \
            or set(s3_config) - {"addressing_style"}:
        return None
    config_file = env.get("AWS_CONFIG_FILE") or str(Path("~/.aws/config").expanduser())
    if Path(config_file).exists():
        return None
    given = given_endpoint(options, env)
    if given is None:
        return None
    endpoint = given[0]
    credentials: StaticCredentials | None = None
    if not options.get("anon"):
        key = options.get("key") or client_kwargs.get("aws_access_key_id")
        secret = options.get("secret") or client_kwargs.get("aws_secret_access_key")
        token = options.get("token") or client_kwargs.get("aws_session_token")
        if not (key and secret):
            key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
            token = env.get("AWS_SESSION_TOKEN") or env.get("AWS_SECURITY_TOKEN")
        if not (key and secret):
            return None
        credentials = StaticCredentials(key, secret, token or None)
    region = client_kwargs.get("region_name") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") \
        or DEFAULT_REGION
    style = s3_config.get("addressing_style", "auto")
    host = urlsplit(endpoint).hostname or ""
    virtual = style == "virtual" or (style == "auto" and host.endswith(".amazonaws.com"))
    headers = {"x-amz-request-payer": "requester"} if options.get("requester_pays") else {}
    return _Direct(endpoint, region, credentials, virtual, headers)


async def _put(session: WireSession, url: str, headers: Mapping[str, str], data: bytes, what: str) -> str | None:
    """One PUT of ``data``; returns the answer's ETag. Errors translated."""
    with translated(what):
        async with session.put(url, data, headers=headers) as resp:
            if resp.status >= 300:
                raise await error_from_response(resp, what)
            await resp.read()
            return resp.headers.get("ETag")


def _timestamp(entry: Mapping[str, Any]) -> float | None:
    value = entry.get("LastModified")
    return float(value.timestamp()) if hasattr(value, "timestamp") else None


def _preload_models(session: Any) -> None:
    """Parse the S3 model files into the session's loader cache (blocking: run in a thread).

    Creating a client parses a few MB of JSON (0.1-0.5 s of CPU); done here
    first, the client's creation on the loop finds them cached. Only a
    speed-up: if botocore's loader changes, the client parses them itself.
    """
    try:
        loader = session.get_component("data_loader")
        loader.load_service_model("s3", "service-2")
        loader.load_service_model("s3", "endpoint-rule-set-1")
        for name in ("endpoints", "partitions", "sdk-default-configuration", "_retry"):
            loader.load_data(name)
    except Exception as exc:  # noqa: BLE001 - an optimisation must never fail the store
        logger.debug("could not preload botocore models: %r", exc)


async def _credentials(fs: Any) -> Any:
    """Static credentials from the storage options, else the session's provider chain; None if anonymous."""
    if fs.anon:
        return None
    client_kwargs = fs.client_kwargs or {}
    key = fs.key or client_kwargs.get("aws_access_key_id")
    secret = fs.secret or client_kwargs.get("aws_secret_access_key")
    token = fs.token or client_kwargs.get("aws_session_token")
    if key and secret:
        return StaticCredentials(key, secret, token)
    credentials = await fs.session.get_credentials()
    if credentials is None:
        raise AccessDenied(
            f"s3: no AWS credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, "
            "key/secret storage options, or anon=True)"
        )
    return credentials
