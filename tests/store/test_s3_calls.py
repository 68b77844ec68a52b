"""S3's control calls signed by stager itself (listing, multipart uploads): against rclone and scripted answers."""

from __future__ import annotations

import os

import pytest

from stager.config import RetryConfig, SourceConfig
from stager.errors import OriginUnavailable, ShardNotFound
from stager.store import open_store
from stager.store.s3_calls import DirectClient
from stager.store.s3_store import S3Store

from .outright import last_line_of
from .scripted_http import ScriptedOrigin, status

FAST_RETRY = RetryConfig(attempts=4, backoff_base=0.001, backoff_max=0.01, deadline=30.0, request_timeout=10.0)
KEYS = {"key": "stageraccess01", "secret": "stagersecret0123456789"}
PART = 5 << 20  # S3's smallest part but the last


@pytest.fixture(autouse=True)
def no_aws_config(tmp_path, monkeypatch):
    # keys and endpoint given outright, and no config file that could change the region: signed directly
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "absent"))


async def test_a_multipart_upload_started_listed_completed_and_aborted_by_signed_requests(s3_bucket):
    data = os.urandom(PART + 1000)
    async with open_store(SourceConfig(f"s3://{s3_bucket.name}/up", s3_bucket.storage_options()),
                          retry=FAST_RETRY) as store:
        assert isinstance(store, S3Store) and isinstance(await store._control_client(), DirectClient)
        upload = await store.open_upload("big.bin", part_size=PART)
        await upload.write_part(1, data[:PART])
        resumed = await store.resume_upload("big.bin", part_size=PART, token=upload.token, parts={1: PART})
        await resumed.write_part(2, data[PART:])
        await resumed.complete()
        assert await store.read("big.bin") == data
        assert [(o.path, o.size) for o in await store.list()] == [("big.bin", len(data))]

        dropped = await store.open_upload("dropped.bin", part_size=PART)
        await dropped.write_part(1, data[:PART])
        token = dropped.token
        await dropped.abort()
        with pytest.raises(ShardNotFound):  # NoSuchUpload
            await store.resume_upload("dropped.bin", part_size=PART, token=token, parts={1: PART})
        assert not await store.exists("dropped.bin")


async def test_a_listing_longer_than_a_page_is_read_page_by_page(s3_bucket):
    folder = s3_bucket.path / "many"
    folder.mkdir()
    for i in range(1003):
        (folder / f"k{i:04d}").write_bytes(b"x" * (i % 7))
    async with open_store(SourceConfig(f"s3://{s3_bucket.name}/many", s3_bucket.storage_options()),
                          retry=FAST_RETRY) as store:
        pages = [page async for page in store.scan()]
    assert [len(page) for page in pages] == [1000, 3]
    found = [o for page in pages for o in page]
    assert [(o.path, o.size) for o in found] == [(f"k{i:04d}", i % 7) for i in range(1003)]
    assert all(o.mtime is not None for o in found)


@pytest.fixture
async def scripted():
    origin = await ScriptedOrigin().start()
    try:
        async with open_store(SourceConfig("s3://bkt/pre", {**KEYS, "endpoint_url": origin.url}),
                              retry=FAST_RETRY) as store:
            yield origin, store
    finally:
        await origin.stop()


OK_COMPLETE = b'<?xml version="1.0"?><CompleteMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">' \
              b'<ETag>"abc-2"</ETag></CompleteMultipartUploadResult>'
ERROR_IN_A_200 = b"<Error><Code>InternalError</Code><Message>We encountered an internal error.</Message></Error>"


async def test_a_complete_that_fails_inside_a_200_answer_is_retried(scripted):
    origin, store = scripted
    client = await store._control_client()
    origin.script = [status(200, ERROR_IN_A_200), status(200, OK_COMPLETE)]
    parts = {"Parts": [{"PartNumber": 1, "ETag": '"e1"'}, {"PartNumber": 2, "ETag": '"e&2"'}]}
    out = await store.retry.run(lambda: client.complete_multipart_upload(Bucket="bkt", Key="pre/o", UploadId="u/1",
                                                                         MultipartUpload=parts), what="o")
    assert out == {"ETag": '"abc-2"'}
    sent = origin.seen[-1]
    assert (sent.method, sent.path, sent.query) == ("POST", "bkt/pre/o", "uploadId=u%2F1")
    assert sent.body == (b'<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>"e1"</ETag></Part>'
                         b'<Part><PartNumber>2</PartNumber><ETag>"e&amp;2"</ETag></Part></CompleteMultipartUpload>')
    assert sent.headers["x-amz-content-sha256"] != "UNSIGNED-PAYLOAD"  # the body is signed

    origin.script = [status(200, ERROR_IN_A_200)] * 10
    with pytest.raises(OriginUnavailable, match="InternalError"):
        await store.retry.run(lambda: client.complete_multipart_upload(Bucket="bkt", Key="pre/o", UploadId="u",
                                                                       MultipartUpload=parts), what="o")


async def test_an_answer_that_is_not_xml_or_lacks_what_it_must_hold_is_retried(scripted):
    origin, store = scripted
    started = b"<InitiateMultipartUploadResult><UploadId>up-1</UploadId></InitiateMultipartUploadResult>"
    origin.script = [status(200, b"<Initiate"), status(200, b"<InitiateMultipartUploadResult/>"), status(200, started)]
    upload = await store.open_upload("o.bin", part_size=PART)
    assert upload.token == "up-1"
    assert [s.method for s in origin.seen] == ["POST"] * 3 and origin.seen[-1].query == "uploads="

    origin.script = [status(200, b"x" * 100)] * 10
    with pytest.raises(OriginUnavailable, match="not XML"):
        await store.open_upload("o.bin", part_size=PART)


def test_replicating_between_s3_buckets_with_keys_given_outright_loads_no_botocore(s3_bucket, tmp_path):
    s3_bucket.server.put_object(s3_bucket.name, "src/a.bin", os.urandom(70_000))
    code = ("import sys\nfrom stager.cli import main\n"
            f"main(['index', 's3://{s3_bucket.name}/src'])\n"
            f"main(['replicate', 's3://{s3_bucket.name}/src', 's3://{s3_bucket.name}/dst', '--state-dir', "
            f"{str(tmp_path / 'state')!r}, '--json'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('botocore', 'aiobotocore', 's3fs')))")
    assert last_line_of(code, s3_bucket, tmp_path) == "[]"
    assert (s3_bucket.path / "dst" / "a.bin").read_bytes() == (s3_bucket.path / "src" / "a.bin").read_bytes()


def test_staging_from_s3_loads_neither_the_xml_calls_nor_urllib_request(s3_bucket, tmp_path):
    # A staging run only reads: the listing and multipart calls (XML, and urllib.request behind
    # xml.sax.saxutils, 8 ms of start-up) stay unloaded until something lists or uploads.
    from stager.write import generate_corpus

    generate_corpus(s3_bucket.path / "corpus", shards=2, tokens_per_shard=1 << 12, seed=1)
    code = ("import sys\nfrom stager.cli import main\n"
            "try:\n"
            f"    main(['stage', 's3://{s3_bucket.name}/corpus', '--cache', {str(tmp_path / 'cache')!r}, '--json'])\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print(sorted(m for m in sys.modules if m in ('stager.store.s3_calls', 'urllib.request', "
            "'xml.sax.saxutils', 'xml.etree.ElementTree')))")
    assert last_line_of(code, s3_bucket, tmp_path) == "[]"
    assert len(list((tmp_path / "cache" / "blobs").rglob("*"))) >= 2
