"""A manifest damaged on the origin itself (a real rclone S3 bucket), one flipped byte at a dozen offsets.

Every entry point refuses it with one line naming the file: ``stager index
--check``, ``stager stage``, the iterator and ``stager mount``; each after
reading it again within a short retry budget (it might have been damaged in
transit), never parsing it as the truth.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from stager.config import FetchConfig, RetryConfig
from stager.errors import ManifestError
from stager.iterator import TokenIterator
from stager.manifest import MANIFEST_PATH, encode_manifest
from tests.cli.runner import assert_one_line_error, run_here
from tests.iterator.corpus import write_counting_corpus
from tests.manifest.test_parquet import good_manifest
from tests.manifest.test_seal import flipped, legacy_bytes, spread_offsets

#: Seconds of retries for the damaged manifest: a few reads, then the error.
DEADLINE = "2"  # short, yet more than one loaded request takes
#: Where the byte is flipped (the offsets themselves depend on the file: see ``spread_offsets``).
OFFSETS = list(spread_offsets(encode_manifest(good_manifest())))


@pytest.fixture
def dataset(s3_bucket, monkeypatch):
    """A small token dataset in a real bucket; the process talks to it through the AWS_* variables."""
    write_counting_corpus(s3_bucket.path / "ds", [3000 + 41 * i for i in range(12)], block_size=4096)
    for key, value in s3_bucket.env().items():
        monkeypatch.setenv(key, value)
    path = s3_bucket.path / "ds" / MANIFEST_PATH
    return s3_bucket, f"{s3_bucket.url}/ds", path, path.read_bytes()


def damage(path, good: bytes, where: str) -> None:
    path.write_bytes(flipped(good, spread_offsets(good)[where]))


@pytest.mark.parametrize("where", OFFSETS)
def test_index_check_stage_and_the_iterator_refuse_it_in_one_line(dataset, where, tmp_path, capsys):
    bucket, url, path, good = dataset
    damage(path, good, where)
    name = f"{url}/{MANIFEST_PATH}"
    checked = run_here(["index", "--check", url, "--retry-deadline", DEADLINE], capsys)
    assert_one_line_error(checked, name, "digest")
    staged = run_here(["stage", url, "--cache", str(tmp_path / "cache"), "--capacity", "100MB", "--no-daemon",
                       "--retry-deadline", DEADLINE], capsys)
    assert_one_line_error(staged, name, "digest")
    fetch = FetchConfig(durable=False, retry=RetryConfig(attempts=4, backoff_base=0.01, backoff_max=0.05,
                                                         deadline=5, request_timeout=5))
    with pytest.raises(ManifestError) as info:
        TokenIterator(url, seq_len=16, cache_dir=tmp_path / "cache", capacity=1 << 30, fetch=fetch, log_every=0)
    message = str(info.value)
    assert message.startswith(f"{name}: ") and "digest" in message and "\n" not in message, message
    assert "4 read(s)" in message  # read again within the budget before it was refused


@pytest.mark.parametrize("where", OFFSETS)
def test_the_mount_refuses_it_in_one_line_and_mounts_nothing(dataset, where, tmp_path):
    from tests.fuse.mounts import Mount

    bucket, url, path, good = dataset
    damage(path, good, where)
    mount = Mount(url, tmp_path / "m", "--retry-deadline", DEADLINE, env=bucket.env())
    try:
        result = subprocess.run(mount.command(), capture_output=True, text=True, timeout=60, env=mount.env)
        assert_one_line_error(result, f"{url}/{MANIFEST_PATH}", "digest")
        assert not os.path.ismount(mount.path)
    finally:
        mount.stop()


def test_index_check_says_a_legacy_manifest_is_valid_but_not_self_verifying(dataset, capsys):
    bucket, url, path, good = dataset
    from stager.manifest import decode_manifest

    path.write_bytes(legacy_bytes(decode_manifest(good, "m")))
    result = run_here(["index", "--check", url], capsys)
    assert result.returncode == 0, result.stderr
    assert "valid, 12 files" in result.stdout and "not self-verifying" in result.stdout
    assert f"stager index {url}" in result.stdout  # the way to add the digest
    assert run_here(["index", url, "--block-size", "4KiB"], capsys).returncode == 0
    again = run_here(["index", "--check", url], capsys)
    assert "digest verified" in again.stdout, again.stdout
