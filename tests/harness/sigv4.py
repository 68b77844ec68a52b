"""Moved to stager.testing.sigv4 (shared with the demo and the benchmarks)."""

from stager.testing.sigv4 import *  # noqa: F401,F403
