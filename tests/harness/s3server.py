"""Moved to stager.testing.s3server (shared with the demo and the benchmarks)."""

from stager.testing.s3server import *  # noqa: F401,F403
