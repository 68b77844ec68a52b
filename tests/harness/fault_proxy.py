"""Moved to stager.testing.fault_proxy (shared with the demo and the benchmarks)."""

from stager.testing.fault_proxy import *  # noqa: F401,F403
