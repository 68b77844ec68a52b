"""Shared fixtures: real origins on loopback (see tests/harness); how the suite splits over workers.

``make test`` runs the suite on pytest-xdist workers with ``--dist loadgroup``. Each test file is one
group, so a file's module-scoped servers, corpora and killed jobs are made once, on one worker. The
files that mount small file systems (tmpfs, ext4 on a loop device) for full-disk tests share one group:
they run one after another, never two mounts and disk fillers at once.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.harness.fixtures"]

#: Files whose tests mount small disks (tests/cache/small_disk.py).
SMALL_DISKS = ("tests/cache/test_disk_full.py", "tests/cli/test_disk_full.py", "tests/iterator/test_small_cache.py")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            path = item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group("small-disks" if path in SMALL_DISKS else path))
