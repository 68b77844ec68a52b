"""Source identities: what makes two dataset requests the same store, and the same data."""

from __future__ import annotations

from stager.config import SourceConfig
from stager.identity import SourceIdentities, normalise_url

SECRET = "sk-the-secret-of-consumer-a"


def _source(url: str = "s3://bkt/corpus", **options) -> SourceConfig:
    base = {"key": "AKIDA", "secret": SECRET, "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}
    return SourceConfig(url, {**base, **options})


def test_access_is_url_and_every_option_location_leaves_the_credentials_out():
    ids = SourceIdentities()
    a = _source()
    assert ids.access(a) == ids.access(_source("S3://bkt/corpus/")), "one spelling per dataset"
    other_secret = _source(secret="sk-someone-else")
    assert ids.access(other_secret) != ids.access(a)
    assert ids.location(other_secret) == ids.location(a), "the same data, read by someone else"
    assert ids.location(_source(anon=True, key=None, secret=None)) == ids.location(a)
    elsewhere = _source(client_kwargs={"endpoint_url": "http://127.0.0.2:9000"})
    assert ids.location(elsewhere) != ids.location(a) and ids.access(elsewhere) != ids.access(a)
    nested = _source(client_kwargs={"endpoint_url": "http://127.0.0.1:9000", "aws_secret_access_key": "x"})
    assert ids.location(nested) == ids.location(a) and ids.access(nested) != ids.access(a)
    assert ids.access(SourceConfig("s3://bkt/corpus")) != ids.access(SourceConfig("s3://bkt/other"))


def test_identities_are_keyed_digests_that_hold_no_secret():
    first, second = SourceIdentities(), SourceIdentities()
    a = _source()
    assert first.access(a) != second.access(a), "each daemon has its own key"
    assert SourceIdentities(b"k" * 32).access(a) == SourceIdentities(b"k" * 32).access(a)
    for digest in (first.access(a), first.location(a)):
        assert len(digest) == 64 and SECRET not in digest and "AKIDA" not in digest


def test_normalise_url():
    assert normalise_url("S3://Bucket/x//") == "s3://Bucket/x"
    assert normalise_url("/data/corpus/") == "/data/corpus"
    assert normalise_url("/") == "/"
