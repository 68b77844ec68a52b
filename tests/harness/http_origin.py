"""Moved to stager.testing.http_origin (shared with the demo and the benchmarks)."""

from stager.testing.http_origin import *  # noqa: F401,F403
