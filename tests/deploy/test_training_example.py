"""The example training loop that deploy/slurm/train.sbatch runs trains, checkpoints, resumes, and runs under torchrun.

On CPU, on a small local corpus, without a daemon (the same script finds one through
STAGER_SOCKET when the prolog started it). torchrun's rendezvous stays on loopback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from stager.write import write_token_shards
from tests.deploy.manifests import REPO

TRAIN = REPO / "deploy" / "slurm" / "train.py"


def _corpus(root: Path) -> Path:
    rng = np.random.default_rng(0)
    write_token_shards(root / "data", [rng.integers(0, 1000, 40_000, dtype=np.uint16) for _ in range(4)])
    return root / "data"


def _run(argv: list[str], cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    result = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_example_trains_saves_and_resumes_where_it_stopped(tmp_path):
    data = _corpus(tmp_path)
    common = [sys.executable, str(TRAIN), str(data), "--cache", str(tmp_path / "cache"), "--seq-len", "64",
              "--vocab", "1000", "--checkpoint", str(tmp_path / "ckpt.pt"), "--save-every", "6"]
    first = _run([*common, "--steps", "12"], tmp_path)
    assert "step 10 loss" in first and "done: 12 steps" in first and "resumed" not in first
    second = _run([*common, "--steps", "18"], tmp_path)
    assert "resumed at step 12" in second and "done: 18 steps" in second
    assert "step 10 loss" not in second  # it went on from the checkpoint, not from the start
    assert "for data, 0 bytes staged" in second  # the cache the first run filled served it all


def test_the_example_runs_under_torchrun_with_two_ranks(tmp_path):
    data = _corpus(tmp_path)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    out = _run([*torchrun, str(TRAIN), str(data), "--cache", str(tmp_path / "cache"), "--seq-len", "64",
                "--vocab", "1000", "--steps", "4"], tmp_path)
    assert out.count("done: 4 steps") == 1  # rank 0 reports for both
