"""Moved to stager.testing.web_thread (shared with the demo and the benchmarks)."""

from stager.testing.web_thread import *  # noqa: F401,F403
