"""Fixtures for mount tests: a dataset behind a fault proxy, and mounts that are always unmounted."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .mounts import Mount


@pytest.fixture
def mount_factory(tmp_path: Path) -> Iterator[Callable[..., Mount]]:
    """``mount_factory(source_url, *args, name="m0")`` -> a started :class:`Mount` (stopped at teardown)."""
    mounts: list[Mount] = []

    def make(source: str, *args: str, name: str | None = None, start: bool = True, **kwargs) -> Mount:
        mount = Mount(source, tmp_path / (name or f"m{len(mounts)}"), *args, **kwargs)
        mounts.append(mount)
        return mount.start() if start else mount

    try:
        yield make
    finally:
        errors = []
        for mount in reversed(mounts):
            try:
                mount.stop()
            except Exception as exc:  # noqa: BLE001 - stop the others, then report
                errors.append(exc)
        if errors:
            raise errors[0]
