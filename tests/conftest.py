"""Shared fixtures: real origins on loopback (see tests/harness)."""

pytest_plugins = ["tests.harness.fixtures"]
