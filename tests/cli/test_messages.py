"""What the commands say: summaries that agree with the errors, refusals that name URL and endpoint,
samples that check something, and task groups reported as one line."""

from __future__ import annotations

import asyncio
import json

import pytest

from stager.errors import AccessDenied, OriginUnavailable, first_error, group_message
from stager.manifest import MANIFEST_PATH
from stager.loopback.fault_plan import FaultPlan
from tests.engine.corpus import make_corpus

from .runner import assert_one_line_error, run, run_here


def test_the_summary_counts_only_the_shards_that_were_staged(http_origin, fault_proxy, tmp_path):
    make_corpus(http_origin.root / "corpus", shards=3)
    proxy = fault_proxy(http_origin, FaultPlan(slowdown_p=1.0, path_contains="shard-00001"))
    result = run(["stage", f"{proxy.url}/corpus", "--cache", str(tmp_path / "cache"), "--capacity", "100MB",
                  "--retry-deadline", "1", "--no-hedge"], timeout=60)
    assert result.returncode == 1
    assert "staged 2 of 3 shards" in result.stdout, result.stdout
    assert "staged 3 shards" not in result.stdout
    assert "1 of 3 shards could not be staged" in result.stderr


def test_a_refused_connection_names_the_url_and_the_endpoint(tmp_path, capsys, monkeypatch):
    import socket

    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "stagertest")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "stagertestsecret")
    result = run_here(["stage", "s3://bucket/corpus", "-o", f"endpoint_url=http://user:pw@127.0.0.1:{port}",
                       "--cache", str(tmp_path / "cache"), "--retry-deadline", "0.5"], capsys)
    assert_one_line_error(result, f"s3://bucket/corpus/{MANIFEST_PATH}", f"endpoint {endpoint}", "refused")
    assert "user:pw" not in result.stderr and "pw@" not in result.stderr


def test_a_403_names_the_url_and_the_endpoint(s3_bucket, tmp_path, capsys, monkeypatch):
    make_corpus(s3_bucket.path / "corpus", shards=1)
    for name, value in s3_bucket.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-at-all")
    result = run_here(["stage", f"{s3_bucket.url}/corpus", "--cache", str(tmp_path / "cache")], capsys)
    assert_one_line_error(result, f"{s3_bucket.url}/corpus/{MANIFEST_PATH}",
                          f"endpoint {s3_bucket.server.endpoint_url}", "denied")
    assert "not-the-secret-at-all" not in result.stderr


def test_a_small_sample_still_verifies_something(http_origin, tmp_path):
    make_corpus(http_origin.root / "corpus", shards=3)
    cache = str(tmp_path / "cache")
    run(["stage", f"{http_origin.url}/corpus", "--cache", cache, "--capacity", "100MB"], check=True)
    for _ in range(5):  # without the floor, 10% of 3 blobs is nothing about three times in four
        report = json.loads(run(["verify", "--cache", cache, "--sample", "0.1", "--json"], check=True).stdout)
        assert report["blobs_checked"] >= 1


def test_a_group_of_stager_errors_is_its_first_error_and_a_count():
    group = ExceptionGroup("tasks", [AccessDenied("a: denied"),
                                     ExceptionGroup("inner", [OriginUnavailable("b: down"), AccessDenied("c")])])
    assert group_message(group) == "a: denied (and 2 other errors)"
    assert group_message(ExceptionGroup("one", [AccessDenied("a: denied")])) == "a: denied"
    assert group_message(BaseExceptionGroup("x", [AccessDenied("a"), asyncio.CancelledError()])) == "a"
    assert group_message(ExceptionGroup("bug", [AccessDenied("a"), KeyError("k")])) is None
    assert isinstance(first_error(ExceptionGroup("bug", [KeyError("k"), AccessDenied("a")])), AccessDenied)


def test_errors_of_a_task_group_reach_the_user_as_one_line(tmp_path, capsys):
    for i in range(3):  # three .npy files that are not NumPy files, hashed in one task group
        (tmp_path / f"s{i}.npy").write_bytes(b"notnumpy")
    result = run(["index", str(tmp_path), "--concurrency", "4"])
    errors = [line for line in result.stderr.splitlines() if line.startswith("stager: error:")]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    # one line, the first error's; how many others failed before the group cancelled the rest varies
    assert len(errors) == 1 and "not a readable .npy file" in errors[0], errors


def test_a_bug_inside_a_group_keeps_its_traceback(capsys, monkeypatch):
    async def broken(*args, **kwargs):
        raise ExceptionGroup("tasks", [AccessDenied("a: denied"), KeyError("bug")])

    monkeypatch.setattr("stager.demo.run_demo", broken)
    with pytest.raises(ExceptionGroup):  # not turned into a line: the traceback shows the bug
        run_here(["demo", "--dir", "unused"], capsys)


def test_the_readme_open_session_snippet_runs_as_written(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:]]
    snippet = next(b for b in blocks if "open_session(" in b)
    make_corpus(tmp_path / "corpus", shards=2)
    code = (snippet.replace("/nvme/stager", str(tmp_path / "cache"))
            .replace("s3://bucket/corpus", str(tmp_path / "corpus")))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_stager_alone_shows_the_usage_not_an_error(capsys):
    result = run_here([], capsys)
    assert "Usage: stager" in result.stderr and "Commands:" in result.stderr
    assert "stager: error:" not in result.stderr


def test_verify_of_a_directory_that_holds_no_cache_fails_and_makes_none(tmp_path, capsys):
    missing = tmp_path / "mistyped"
    assert_one_line_error(run_here(["verify", "--cache", str(missing)], capsys), str(missing), "no stager cache")
    assert not missing.exists()
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run_here(["verify", "--cache", str(tmp_path / "empty")], capsys), "nothing to verify")
    assert list((tmp_path / "empty").iterdir()) == []


def test_status_of_a_cache_not_made_yet_reports_it_empty_and_makes_nothing(tmp_path, capsys):
    missing = tmp_path / "not-yet" / "cache"
    result = run_here(["status", "--cache", str(missing), "--json"], capsys)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["cache"] == str(missing) and report["used"] == 0 and report["datasets"] == []
    assert report["capacity"] > 0
    assert not (tmp_path / "not-yet").exists()
