"""Fixtures of the daemon tests (see node.py)."""

from tests.daemon.node import corpus, node  # noqa: F401
