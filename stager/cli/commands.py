"""Imports every subcommand module so each registers itself on the ``cli`` group."""

from . import demo, index, stage, status  # noqa: F401
