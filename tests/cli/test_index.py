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
from stager.loopback.fault_plan import FaultPlan

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
    "backslash": "backslash",
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
    elif kind == "backslash":
        rows[0]["path"] = "sub\\part-1.bin"  # '--check' and 'stage' must judge it by one rule
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


def test_a_prefix_holding_nothing_fails_naming_it_unless_allow_empty(tmp_path, s3_bucket, capsys):
    (s3_bucket.path / "real").mkdir()
    (s3_bucket.path / "real" / "x.bin").write_bytes(b"\0\0")
    url = f"{s3_bucket.url}/typo"
    result = run(["index", url], env=s3_bucket.env())
    assert_one_line_error(result, url, "no files", "--allow-empty")
    assert not (s3_bucket.path / "typo").exists()  # nothing written
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "only.tmp").write_bytes(b"x")
    assert_one_line_error(run_here(["index", str(empty), "--exclude", "*.tmp"], capsys), str(empty), "--exclude")
    assert not (empty / MANIFEST_PATH).exists()
    assert run_here(["index", str(empty), "--exclude", "*.tmp", "--allow-empty"], capsys).returncode == 0
    assert len(read_manifest_file(str(empty / MANIFEST_PATH))) == 0


def write_weights(root):
    """A folder of model weights: .bin files that are not token shards, some of an odd size."""
    rng = np.random.default_rng(3)
    root.mkdir(parents=True, exist_ok=True)
    (root / "pytorch_model-00001.bin").write_bytes(rng.bytes(300_001))
    (root / "pytorch_model-00002.bin").write_bytes(rng.bytes(120_000))
    (root / "config.json").write_text("{}")


def test_a_folder_of_weights_indexes_without_knowing_about_dtype(tmp_path):
    write_weights(tmp_path / "w")
    result = run(["index", str(tmp_path / "w")])
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "pytorch_model-00001.bin" in result.stdout + result.stderr  # named as not tokens
    manifest = read_manifest_file(str(tmp_path / "w" / MANIFEST_PATH))
    odd = manifest[manifest.index_of("pytorch_model-00001.bin")]
    assert (odd.dtype, odd.tokens) == (None, None)
    even = manifest[manifest.index_of("pytorch_model-00002.bin")]
    assert (even.dtype, even.tokens) == ("uint16", 60_000)  # .bin has no header: whole uint16 is taken as tokens


def test_an_explicit_dtype_that_does_not_fit_is_one_line_naming_the_file(tmp_path):
    write_weights(tmp_path / "w")
    result = run(["index", str(tmp_path / "w"), "--dtype", "uint16"])
    assert_one_line_error(result, "pytorch_model-00001.bin", "uint16")
    assert not (tmp_path / "w" / MANIFEST_PATH).exists()


def test_index_of_a_remote_source_through_a_corrupting_origin_records_true_digests(tmp_path, s3_bucket, fault_proxy):
    write_files(tmp_path / "local", count=4, seed=4)
    shutil.copytree(tmp_path / "local", s3_bucket.path / "ds")
    # 30% of GET bodies with one flipped byte, 5% cut short
    proxy = fault_proxy(s3_bucket, FaultPlan(flip_p=0.30, truncate_p=0.025, reset_p=0.025), seed=9)
    run(["index", f"{s3_bucket.url}/ds", "--block-size", "32KiB"], env=s3_bucket.env(proxy.url), check=True)
    run(["index", str(tmp_path / "local"), "--block-size", "32KiB"], check=True)
    assert comparable(s3_bucket.path / "ds" / MANIFEST_PATH) == comparable(tmp_path / "local" / MANIFEST_PATH)
    assert proxy.faults.get("flip", 0) > 0, proxy.faults
