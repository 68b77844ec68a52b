"""Moved to stager.testing.bandwidth (shared with the demo and the benchmarks)."""

from stager.testing.bandwidth import *  # noqa: F401,F403
