"""Moved to stager.testing.fault_plan (shared with the demo and the benchmarks)."""

from stager.testing.fault_plan import *  # noqa: F401,F403
