"""`stager checkpoints drain LOCAL_DIR URL --replica URL`: a folder a framework wrote, with the same guarantees."""

from __future__ import annotations

import os

import pytest

from stager.checkpoint.manifest import MANIFEST_PATH, CheckpointManifest
from stager.cli import main


def test_drain_sends_a_plain_folder_to_both_stores_manifest_last(sides, tmp_path, capsys):
    dest, replica = sides
    folder = tmp_path / "hf"
    (folder / "sub").mkdir(parents=True)
    files = {"config.json": b'{"hidden": 8}', "model.safetensors": os.urandom(300_000), "sub/tokenizer.json": b"{}"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    main(["checkpoints", "drain", str(folder), dest.url("run/hf"), "--replica", replica.url("run/hf"),
          "--staging", str(tmp_path / "staging"), *dest.flags("-o"), *replica.flags("-r")])
    assert "drained" in capsys.readouterr().out
    for side in sides:
        root = side.path("run/hf")
        assert {n: (root / n).read_bytes() for n in files} == files
        manifest = CheckpointManifest.decode((root / MANIFEST_PATH).read_bytes(), "m")
        assert manifest.stores == (dest.url("run/hf"), replica.url("run/hf"))


def test_bad_input_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as info:
        main(["checkpoints", "drain", str(tmp_path / "empty"), (tmp_path / "d").as_uri(),
              "--staging", str(tmp_path / "s")])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no files to drain" in err
    damaged = tmp_path / "d2" / "step-1" / MANIFEST_PATH
    damaged.parent.mkdir(parents=True)
    damaged.write_text('{"format": 1, "digest": "00"}')
    with pytest.raises(SystemExit) as info:
        main(["checkpoints", "verify", (tmp_path / "d2" / "step-1").as_uri()])
    err = capsys.readouterr().err
    assert info.value.code == 1 and err.count("\n") == 1 and "no good checkpoint manifest" in err


def test_manifest_checks_itself():
    from stager.errors import ManifestError

    good = CheckpointManifest((), ("s3://a/b",)).encode()
    assert CheckpointManifest.decode(good, "m").stores == ("s3://a/b",)
    with pytest.raises(ManifestError, match="m: digest mismatch"):
        CheckpointManifest.decode(good.replace(b"s3://a/b", b"s3://a/c"), "m")
    with pytest.raises(ManifestError, match="not JSON"):
        CheckpointManifest.decode(b"\x00", "m")
