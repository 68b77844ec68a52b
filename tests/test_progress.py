"""Progress output: a bar on a terminal, plain lines in a batch job's log (and no rich import there)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stager import progress


def test_outside_a_terminal_progress_is_a_line_now_and_then_and_one_at_the_end(capsys, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    with progress.byte_progress("staging") as bar:
        bar.set_total(4, 400_000_000)
        bar.advance(100_000_000)
        clock[0] += 2  # sooner than LINE_INTERVAL: nothing yet
        bar.advance(50_000_000)
        assert capsys.readouterr().err == ""
        clock[0] += progress.LINE_INTERVAL
        bar.describe("4 files, 3 retries")
        first = capsys.readouterr().err
        clock[0] += 1
        bar.advance(250_000_000)
    last = capsys.readouterr().err
    assert first == "staging 4 files, 3 retries: 150.0/400.0 MB (38%), 12.5 MB/s, 0:00:20 left\n"
    assert last == "staging 4 files, 3 retries: 400.0/400.0 MB (100%), 30.8 MB/s\n"


def test_the_progress_line_is_written_even_when_the_command_fails(capsys):
    with pytest.raises(RuntimeError):
        with progress.byte_progress("hashing") as bar:
            bar.advance(5_000_000)
            raise RuntimeError("origin down")
    assert capsys.readouterr().err.startswith("hashing: 5.0 MB, ")


def test_stage_does_not_import_rich_outside_a_terminal():
    code = "import sys, stager.cli.stage; print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_terminal_gets_the_rich_bar(monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with progress.byte_progress("staging") as bar:
        bar.set_total(1, 10)
        bar.advance(10)
        assert type(bar).__name__ == "_BarProgress"
