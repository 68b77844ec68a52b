"""Running the real ``stager`` command in a subprocess, as users do."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
from typing import Mapping, Sequence

STAGER = [sys.executable, "-m", "stager"]


def run(args: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 120,
        check: bool = False) -> subprocess.CompletedProcess:
    result = subprocess.run([*STAGER, *args], capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise AssertionError(f"stager {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def start(args: Sequence[str], *, env: Mapping[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([*STAGER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """Non-zero exit, one line on stderr starting with 'stager: error:', no traceback."""
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("stager: error: "), lines[0]
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def run_here(args: Sequence[str], capsys, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the command in this process (faster than a subprocess; same code path from argv to exit).

    ``env`` is set for the call only. Log records go to stderr as the command's own would (pytest's
    handlers make the command's ``basicConfig`` a no-op here), so stderr holds what a user sees; the
    collector settings and the CPUs ``main`` changes for a one-shot process are put back.
    """
    from stager.cli import main

    capsys.readouterr()
    saved_env = {name: os.environ.get(name) for name in (env or {})}
    os.environ.update(env or {})
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    threshold = gc.get_threshold()
    cpus = os.sched_getaffinity(0)  # `stage` keeps its threads on one CPU of two (stager.one_cpu)
    code = 0
    try:
        main(list(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        logging.getLogger().removeHandler(handler)
        gc.unfreeze()
        gc.set_threshold(*threshold)
        os.sched_setaffinity(0, cpus)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, captured.out, captured.err)
