"""The built wheel installs one top-level import name, ``stager``, in a fresh venv.

A top-level ``fuse`` package would shadow (or be shadowed by) the ``fuse``
module of fusepy and mfusepy; the FUSE front end installs as ``stager.fuse``.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
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


#: What a build reads: pyproject.toml's metadata, setup.py's package folders, the README it embeds.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "stager", "fuse")


def build_wheel(workdir: Path) -> Path:
    """Build the wheel from a private copy of the sources, so no build writes into the checkout.

    setuptools keeps its ``build/`` and ``*.egg-info`` trees beside the sources: two builds of one
    tree at once (two workers, or a developer's build while the suite runs) clobber each other's
    files and one of them fails.
    """
    src, out = workdir / "src", workdir / "out"
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *_isolation_flags(), "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=240, cwd=workdir,
    )
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout}\n{done.stderr}"
    (found,) = out.glob("stager-*.whl")
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_two_builds_at_once_both_succeed_and_leave_the_checkout_alone(tmp_path: Path) -> None:
    before = {p.name for p in REPO.iterdir()}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        wheels = list(pool.map(build_wheel, [tmp_path / "a", tmp_path / "b"]))
    contents = [sorted(zipfile.ZipFile(w).namelist()) for w in wheels]
    assert contents[0] == contents[1] and "stager/fuse/mount.py" in contents[0]
    assert {p.name for p in REPO.iterdir()} - before == set()  # no build/ or stager.egg-info appeared


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
