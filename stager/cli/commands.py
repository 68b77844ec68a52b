"""Imports every subcommand module so each registers itself on the ``cli`` group."""

from . import demo, index, mount, replicate, serve, stage, status  # noqa: F401
