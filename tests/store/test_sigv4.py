"""The SigV4 signer the S3 store signs its requests with."""

from __future__ import annotations

import datetime as dt

from stager.store import sigv4

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
WHEN = dt.datetime(2013, 5, 24, tzinfo=dt.timezone.utc)


def test_matches_the_aws_reference_vector():
    # "GET Object" example of the AWS SigV4 header-based authentication docs.
    headers = {
        "Host": "examplebucket.s3.amazonaws.com",
        "Range": "bytes=0-9",
        "x-amz-content-sha256": sigv4.EMPTY_SHA256,
        "x-amz-date": "20130524T000000Z",
    }
    sig = sigv4.signature(
        method="GET", raw_path="/test.txt", raw_query="", headers=headers,
        signed_headers=["host", "range", "x-amz-content-sha256", "x-amz-date"],
        payload_hash=sigv4.EMPTY_SHA256, amz_date="20130524T000000Z",
        scope="20130524/us-east-1/s3/aws4_request", secret_key=SECRET,
    )
    assert sig == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"


def test_sign_headers_gives_the_reference_signature():
    out = sigv4.sign_headers("GET", "https://examplebucket.s3.amazonaws.com/test.txt", access_key="AKIAIOSFODNN7EXAMPLE",
                             secret_key=SECRET, headers={"Range": "bytes=0-9"}, now=WHEN)
    assert out["x-amz-content-sha256"] == sigv4.EMPTY_SHA256
    assert out["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")


def test_a_session_token_and_an_unsigned_payload_are_signed_headers():
    out = sigv4.sign_headers("PUT", "http://127.0.0.1:9000/b/k", access_key="AK", secret_key=SECRET,
                             payload_hash=sigv4.UNSIGNED_PAYLOAD, session_token="TOKEN", now=WHEN)
    assert out["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
    assert out["X-Amz-Security-Token"] == "TOKEN"
    _, _, signed = sigv4.parse_authorization(out["Authorization"])
    assert signed == ["host", "x-amz-content-sha256", "x-amz-date", "x-amz-security-token"]
    assert sigv4.resign_headers("PUT", "/b/k", "", out, secret_key=SECRET) == out  # the signature checks out


def test_the_kept_signing_key_is_that_of_the_secret_and_the_day_asked_for():
    other = sigv4.sign_headers("GET", "https://examplebucket.s3.amazonaws.com/test.txt", access_key="AK",
                               secret_key="another secret", headers={"Range": "bytes=0-9"}, now=WHEN)
    assert "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41" not in other["Authorization"]
    test_sign_headers_gives_the_reference_signature()  # the same day, after another secret's key was kept
    day = sigv4.signing_key(SECRET, "20130524", "us-east-1", "s3")
    assert sigv4.signing_key(SECRET, "20130525", "us-east-1", "s3") != day
    assert sigv4.signing_key(SECRET, "20130524", "eu-west-1", "s3") != day
    assert sigv4.signing_key(SECRET, "20130524", "us-east-1", "s3") == day
