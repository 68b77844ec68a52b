"""Fixtures of the store tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def aws_session():
    """One aiobotocore session for every S3 store of the run.

    Each new session parses botocore's service models again (about 0.2-0.5 s
    of CPU); sharing one keeps the S3 tests fast. It is passed to s3fs as the
    ``session`` storage option, as an application opening many stores would.
    """
    aiobotocore_session = pytest.importorskip("aiobotocore.session")
    return aiobotocore_session.AioSession()
