"""S3's few control calls over the signed HTTP client, for when the keys are given outright.

Indexing and replication list a prefix; replication starts, lists,
completes and aborts multipart uploads and deletes objects. Through s3fs
these load botocore and aiobotocore first, about 60 MB of memory and a third
of a CPU second before the first byte moves, for a handful of requests that
are each one signed HTTP exchange with an XML answer. :class:`DirectClient`
makes exactly those exchanges with the signer and the HTTP client the store
already uses for its reads, and answers in the shapes aiobotocore's client
gives (the same keys, ``LastModified`` a ``datetime``), so the store's
callers do not tell the two apart.

Answers are untrusted: each is read up to :data:`MAX_ANSWER` bytes, parsed
with the standard library's expat parser (no DTDs or entities are expanded
past its limits), and anything malformed is a transient error, retried like a
dropped connection. An error answer goes through the store's usual
translation (``NoSuchUpload`` is :class:`~stager.errors.ShardNotFound`,
``SlowDown`` :class:`~stager.errors.Throttled`, ...), including the error that
``CompleteMultipartUpload`` may send with a 200 status.
"""

from __future__ import annotations

import datetime
import hashlib
from html import escape  # xml.sax.saxutils' escape loads urllib.request: 8 ms of start-up
import xml.etree.ElementTree as ElementTree
from typing import TYPE_CHECKING, Any, Mapping, Protocol
from urllib.parse import quote, urlencode

from ..errors import TransientOriginError
from .http_client import error_from_response
from .translate import error_for_status

if TYPE_CHECKING:
    from .wire import WireSession

#: The longest answer read (a listing page of 1,000 keys is about 300 KB).
MAX_ANSWER = 16 << 20


class RequestSigner(Protocol):
    async def sign(self, method: str, bucket: str, key: str, headers: dict[str, str], *, query: str = "",
                   unsigned_payload: bool = False, payload_sha256: str | None = None) -> tuple[str, dict[str, str]]:
        ...


class DirectClient:
    """The S3 calls indexing and replication need besides reads and part uploads, as signed HTTP requests."""

    def __init__(self, session: "WireSession", signer: RequestSigner) -> None:
        self._session = session
        self._signer = signer

    async def create_multipart_upload(self, *, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803
        root = await self._call("POST", Bucket, Key, "uploads=", f"{Key} (start upload)")
        upload_id = _text(root, "UploadId")
        if not upload_id:
            raise TransientOriginError(f"{Key} (start upload): the answer names no UploadId")
        return {"UploadId": upload_id}

    async def list_parts(self, *, Bucket: str, Key: str, UploadId: str,  # noqa: N803
                         PartNumberMarker: int = 0) -> dict[str, Any]:  # noqa: N803
        query = _query({"part-number-marker": str(PartNumberMarker), "uploadId": UploadId})
        root = await self._call("GET", Bucket, Key, query, f"{Key} (list upload parts)")
        parts = [{"PartNumber": _int(part, "PartNumber"), "Size": _int(part, "Size"), "ETag": _text(part, "ETag")}
                 for part in _children(root, "Part")]
        return {"Parts": parts, "IsTruncated": _text(root, "IsTruncated") == "true",
                "NextPartNumberMarker": _int(root, "NextPartNumberMarker", 0)}

    async def list_objects_v2(self, *, Bucket: str, Prefix: str = "",  # noqa: N803
                              ContinuationToken: str | None = None) -> dict[str, Any]:  # noqa: N803
        fields = {"list-type": "2", "prefix": Prefix}
        if ContinuationToken:
            fields["continuation-token"] = ContinuationToken
        root = await self._call("GET", Bucket, "", _query(fields), f"s3://{Bucket}/{Prefix} (list)")
        contents = []
        for entry in _children(root, "Contents"):
            item: dict[str, Any] = {"Key": _text(entry, "Key") or "", "Size": _int(entry, "Size", 0)}
            if (etag := _text(entry, "ETag")) is not None:
                item["ETag"] = etag
            if (modified := _time(_text(entry, "LastModified"))) is not None:
                item["LastModified"] = modified
            contents.append(item)
        out: dict[str, Any] = {"Contents": contents, "IsTruncated": _text(root, "IsTruncated") == "true"}
        if token := _text(root, "NextContinuationToken"):
            out["NextContinuationToken"] = token
        return out

    async def complete_multipart_upload(self, *, Bucket: str, Key: str, UploadId: str,  # noqa: N803
                                        MultipartUpload: Mapping[str, Any]) -> dict[str, Any]:  # noqa: N803
        parts = "".join(f"<Part><PartNumber>{int(part['PartNumber'])}</PartNumber>"
                        f"<ETag>{escape(str(part['ETag']), quote=False)}</ETag></Part>"
                        for part in MultipartUpload["Parts"])
        body = f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()
        root = await self._call("POST", Bucket, Key, _query({"uploadId": UploadId}), f"{Key} (complete upload)",
                                body=body)
        return {"ETag": _text(root, "ETag")}

    async def abort_multipart_upload(self, *, Bucket: str, Key: str, UploadId: str) -> dict[str, Any]:  # noqa: N803
        await self._call("DELETE", Bucket, Key, _query({"uploadId": UploadId}), f"{Key} (abort upload)")
        return {}

    async def delete_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803
        await self._call("DELETE", Bucket, Key, "", f"{Key} (delete)")
        return {}

    async def _call(self, method: str, bucket: str, key: str, query: str, what: str,
                    body: bytes = b"") -> ElementTree.Element | None:
        """One signed exchange; its XML answer (None if it had no body). Errors as the store raises them."""
        headers = {"Content-Type": "application/xml"} if body else {}
        url, signed = await self._signer.sign(method, bucket, key, headers, query=query,
                                              payload_sha256=hashlib.sha256(body).hexdigest())
        async with self._session.request(method, url, signed, body if body or method == "POST" else None) as resp:
            if resp.status >= 300:
                raise await error_from_response(resp, what)
            data = await resp.read(MAX_ANSWER + 1)
            if len(data) > MAX_ANSWER:
                raise TransientOriginError(f"{what}: an answer of more than {MAX_ANSWER} bytes")
        if not data.strip():
            return None
        try:
            root = ElementTree.fromstring(data)
        except ElementTree.ParseError as exc:
            raise TransientOriginError(f"{what}: an answer that is not XML ({exc})") from exc
        if _name(root) == "Error":  # CompleteMultipartUpload may answer 200 and fail in the body
            raise error_for_status(500, what, code=_text(root, "Code"), detail=_text(root, "Message"))
        return root


def _query(fields: Mapping[str, str]) -> str:
    """A query string as S3 signs it: names sorted, every value percent-encoded (``/`` too)."""
    return urlencode(sorted(fields.items()), quote_via=quote, safe="")


def _name(element: ElementTree.Element) -> str:
    return element.tag.rpartition("}")[2]  # without the namespace S3 puts on every element


def _children(element: ElementTree.Element | None, name: str) -> list[ElementTree.Element]:
    return [] if element is None else [child for child in element if _name(child) == name]


def _text(element: ElementTree.Element | None, name: str) -> str | None:
    found = _children(element, name)
    return (found[0].text or "") if found else None


def _int(element: ElementTree.Element | None, name: str, default: int | None = None) -> int:
    text = _text(element, name)
    try:
        return int(text) if text is not None else _required(default, name)
    except ValueError as exc:
        raise TransientOriginError(f"an S3 answer whose {name} is not a number: {text[:40]!r}") from exc


def _required(default: int | None, name: str) -> int:
    if default is None:
        raise TransientOriginError(f"an S3 answer without {name}")
    return default


def _time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
