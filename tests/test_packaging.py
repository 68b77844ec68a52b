"""The built wheel installs one top-level import name, ``stager``, in a fresh venv.

A top-level ``fuse`` package would shadow (or be shadowed by) the ``fuse``
module of fusepy and mfusepy; the FUSE front end installs as ``stager.fuse``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _isolation_flags() -> list[str]:
    """Build without network when this venv already has a setuptools that reads our pyproject."""
    try:
        import setuptools
    except ImportError:
        return []
    major = int(setuptools.__version__.split(".")[0])
    return ["--no-build-isolation"] if major >= 77 else []


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")  # setuptools' build/ tree, kept out of the checkout
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *_isolation_flags(), "-w", str(out), str(REPO)],
        check=True, timeout=240, cwd=build,
    )
    (found,) = out.glob("stager-*.whl")
    return found


def test_the_wheel_has_one_top_level_name(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top_level = zf.read(next(n for n in names if n.endswith(".dist-info/top_level.txt"))).decode().split()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"stager"}
    assert top_level == ["stager"]
    assert "stager/fuse/__init__.py" in names and "stager/fuse/mount.py" in names
    # Every package folder under stager/ made it in (setup.py finds them; none is listed by hand).
    for init in (REPO / "stager").rglob("__init__.py"):
        assert init.relative_to(REPO).as_posix() in names


def test_a_fresh_venv_gets_stager_and_stager_fuse_and_no_top_level_fuse(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)  # this pip installs into it (--python): no ensurepip run per test
    python = env_dir / "bin" / "python"
    clean_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only what the venv installed
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, timeout=240, env=clean_env)
    probe = ("import importlib.util as u, json, sys\n"
             "print(json.dumps([u.find_spec('fuse') is None, u.find_spec('stager') is not None]))")
    out = subprocess.run([python, "-c", probe], check=True, capture_output=True, text=True, timeout=60,
                         cwd=tmp_path, env=clean_env).stdout
    assert out.strip() == "[true, true]"
    (site,) = (env_dir / "lib").glob("python*/site-packages")
    installed = {p.name for p in site.iterdir()} - {"pip", "_distutils_hack", "distutils-precedence.pth",
                                                     "setuptools", "pkg_resources", "__pycache__"}
    installed = {name for name in installed if not name.startswith(("pip-", "setuptools-"))}
    assert {name for name in installed if not name.endswith(".dist-info")} == {"stager"}
    assert (site / "stager" / "fuse" / "operations.py").is_file()
