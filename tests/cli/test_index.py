"""``stager index``: equal manifests from a folder and from S3, atomic under SIGKILL, clear errors."""

from __future__ import annotations

import io
import random
import shutil
import signal
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from stager.manifest import MANIFEST_PATH, read_manifest_file
from stager.manifest.seal import seal
from stager.write import encode_shard
from stager.testing.fault_plan import FaultPlan

from .runner import assert_one_line_error, run, run_here, start


def write_files(root, count=5, seed=0):
    rng = np.random.default_rng(seed)
    for i in range(count):
        path = root / ("sub" if i % 2 else "") / f"part-{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode_shard(rng.integers(0, 60000, 40_000 + i * 9_000, dtype=np.uint16), "bin"))
    (root / "notes.txt").write_text("not a shard")


def comparable(path):
    table = pq.read_table(path).drop_columns(["mtime"])
    return table.to_pylist()


def test_folder_and_s3_bucket_give_equal_manifests(tmp_path, s3_bucket):
    write_files(tmp_path / "local")
    shutil.copytree(tmp_path / "local", s3_bucket.path / "ds")
    run(["index", str(tmp_path / "local"), "--block-size", "64KiB"], check=True)
    result = run(["index", f"{s3_bucket.url}/ds", "--block-size", "64KiB"], env=s3_bucket.env(), check=True)
    assert "indexed 6 files" in result.stdout
    local = comparable(tmp_path / "local" / MANIFEST_PATH)
    remote = comparable(s3_bucket.path / "ds" / MANIFEST_PATH)
    assert local == remote
    manifest = read_manifest_file(str(tmp_path / "local" / MANIFEST_PATH))
    assert manifest[manifest.index_of("sub/part-1.bin")].tokens == 49_000
    assert manifest[manifest.index_of("notes.txt")].tokens is None


def test_include_exclude_and_check(tmp_path, capsys):
    write_files(tmp_path)
    assert run_here(["index", str(tmp_path), "--include", "*.bin", "--exclude", "sub/*"], capsys).returncode == 0
    manifest = read_manifest_file(str(tmp_path / MANIFEST_PATH))
    assert manifest.paths == ["part-0.bin", "part-2.bin", "part-4.bin"]
    result = run_here(["index", "--check", str(tmp_path)], capsys)
    assert result.returncode == 0
    assert "valid, 3 files" in result.stdout


def test_sigkill_leaves_no_manifest_or_the_previous_one(tmp_path, s3_bucket, fault_proxy):
    write_files(s3_bucket.path / "ds", count=12)
    proxy = fault_proxy(s3_bucket, FaultPlan(bandwidth_bps=2_000_000))  # about 1 s of hashing
    env = s3_bucket.env(proxy.url)
    target = s3_bucket.path / "ds" / MANIFEST_PATH
    rng = random.Random(5)
    previous = None
    for _ in range(6):
        proc = start(["index", f"{s3_bucket.url}/ds", "--block-size", "64KiB"], env=env)
        time.sleep(rng.uniform(0.3, 1.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        if target.exists():
            current = comparable(target)  # a readable, complete manifest
            if previous is not None:
                assert current == previous
            previous = current
    run(["index", f"{s3_bucket.url}/ds", "--block-size", "64KiB"], env=env, check=True)
    final = comparable(target)
    assert previous is None or final == previous
    assert len(final) == 13


BAD = {
    "traversal": "path is empty, absolute",
    "duplicate": "duplicate path",
    "digest_count": "block digests",
    "truncated": "not a readable manifest",
    "version": "version 7 is not supported",
    "random": "not a readable manifest",
}


def write_bad_manifest(root, kind, capsys):
    write_files(root, count=3)
    assert run_here(["index", str(root), "--block-size", "64KiB"], capsys).returncode == 0
    path = root / MANIFEST_PATH
    if kind in ("truncated", "random"):
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2] if kind == "truncated" else np.random.default_rng(1).bytes(3000))
        return
    table = pq.read_table(path)
    meta = dict(table.schema.metadata)
    if kind == "version":
        meta[b"stager.format_version"] = b"7"
    rows = table.to_pylist()
    if kind == "traversal":
        rows[0]["path"] = "../../etc/passwd"
    elif kind == "duplicate":
        rows[1]["path"] = rows[0]["path"]
    elif kind == "digest_count":
        rows[2]["blocks"] = rows[2]["blocks"][:-1]
    import pyarrow as pa

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema).replace_schema_metadata(meta), buf)
    # Sealed again (the metadata kept the digest entry, as written before sealing): bad entries
    # under a good digest, as a buggy or hostile writer would leave them.
    path.write_bytes(seal(buf.getvalue()))


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_manifests_give_one_clear_line_and_non_zero_exit(kind, tmp_path, capsys):
    write_bad_manifest(tmp_path / "ds", kind, capsys)
    name = str(tmp_path / "ds" / MANIFEST_PATH)
    # A short retry budget: a manifest that does not parse is read again (it may have been cut in transit).
    result = run_here(["index", "--check", str(tmp_path / "ds"), "--retry-deadline", "1"], capsys)
    assert_one_line_error(result, name, BAD[kind])
    # and every command that loads it refuses it the same way
    staged = run_here(["stage", str(tmp_path / "ds"), "--cache", str(tmp_path / "cache"), "--capacity", "100MB",
                       "--retry-deadline", "1"], capsys)
    assert_one_line_error(staged, BAD[kind])


def test_a_bad_manifest_as_a_real_process(tmp_path, capsys):
    write_bad_manifest(tmp_path / "ds", "traversal", capsys)
    assert_one_line_error(run(["index", "--check", str(tmp_path / "ds")]), BAD["traversal"])


def test_missing_manifest_and_bad_flags_are_one_line_errors(tmp_path, capsys):
    assert_one_line_error(run_here(["index", "--check", str(tmp_path)], capsys), "no manifest", "stager index")
    result = run_here(["stage", str(tmp_path), "--capacity", "lots"], capsys)
    assert_one_line_error(result, "--capacity")
    (tmp_path / "bad.toml").write_text("cache = [unclosed")
    assert_one_line_error(run_here(["--config", str(tmp_path / "bad.toml"), "status"], capsys), "bad.toml", "TOML")


@pytest.mark.parametrize("fmt", ["npy", "parquet", "bin"])
def test_token_metadata_of_each_shard_format(tmp_path, capsys, fmt):
    from stager.write import write_token_shards

    arrays = [np.arange(n, dtype=np.uint32 if fmt == "npy" else np.uint16) for n in (5000, 12345)]
    write_token_shards(tmp_path, arrays, fmt=fmt)
    expected = read_manifest_file(str(tmp_path / MANIFEST_PATH))
    (tmp_path / MANIFEST_PATH).unlink()
    dtype = ["--dtype", "uint16"] if fmt == "bin" else []
    assert run_here(["index", str(tmp_path), *dtype], capsys).returncode == 0
    indexed = read_manifest_file(str(tmp_path / MANIFEST_PATH))
    assert [(e.path, e.digest, e.dtype, e.tokens) for e in indexed] == [(e.path, e.digest, e.dtype, e.tokens) for e in expected]
    assert [e.tokens for e in indexed] == [5000, 12345]
