"""Running a snippet in a fresh interpreter against an S3 bucket whose settings are given outright."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def last_line_of(code: str, bucket, tmp_path: Path, timeout: float = 120) -> str:
    """Run ``code`` in a new Python process with the bucket's endpoint and keys in its environment (no other
    AWS variable, no AWS config file); it must succeed. Returns the last line it printed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                            env={**env, **bucket.env(), "AWS_CONFIG_FILE": str(tmp_path / "absent")})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]
