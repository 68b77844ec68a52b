"""``stager replicate`` as users type it: profiles from the config file, the plan, one-line errors."""

from __future__ import annotations

import json

from tests.cli.runner import assert_one_line_error, run

from .dataset import assert_replica, flags, mixed_files, write_dataset


def toml_table(name: str, options: dict) -> str:
    lines = [f"[{name}]"]
    nested = []
    for key, value in options.items():
        if isinstance(value, dict):
            nested.append(toml_table(f"{name}.{key}", value))
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n\n" + "".join(nested)


def test_profiles_from_the_config_file_and_the_plan_in_words(clusters, tmp_path):
    a, b = clusters
    manifest = write_dataset(a.root / "ds", mixed_files(seed=20, large=(), small=6))
    (b.root / "copy" / "old").mkdir(parents=True)
    (b.root / "copy" / "old" / "gone.bin").write_bytes(b"not in the source")
    config = tmp_path / "stager.toml"
    config.write_text(toml_table("profiles.east", a.options()) + toml_table("profiles.west", b.options())
                      + '[replicate]\nsrc_profile = "east"\ndst_profile = "west"\n')
    base = ["--config", str(config), "replicate", a.url("ds"), b.url("copy"), "--state-dir", str(tmp_path / "st")]

    plan = run([*base, "--dry-run"], check=True)
    assert f"{len(manifest)} missing at the destination" in plan.stdout
    assert "small/0/part-0000.bin" in plan.stdout  # a sample of the paths
    assert "old/gone.bin" in plan.stdout and "--delete removes them" in plan.stdout
    assert not (b.root / "copy" / ".stager").exists()

    done = run([*base, "--delete"], check=True)
    assert f"{len(manifest)} copied" in done.stdout and "1 deleted" in done.stdout and "manifest written" in done.stdout
    assert_replica(a.root / "ds", b.root / "copy")
    assert not (b.root / "copy" / "old" / "gone.bin").exists()

    # A flag overrides its profile's value: the wrong secret is refused by the destination.
    denied = run([*base, "-d", "secret=wrong-secret-123456", "--verify"])
    assert_one_line_error(denied, "denied")


def in_process(args: list[str], capsys) -> tuple[int, str]:
    """Run the command in this process (no start-up cost): exit status and stderr."""
    from stager.cli import main

    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def test_bad_input_is_one_clear_line(clusters, tmp_path, capsys):
    a, b = clusters
    write_dataset(a.root / "ds", mixed_files(seed=21, large=(), small=2))
    src = [a.url("ds"), *flags("-s", a.options())]
    out = str(tmp_path / "o")
    cases = [
        (["replicate", *src, "https://example.com/x"], "read-only"),
        (["replicate", *src, out, "--shard", "4/4"], "--shard"),
        (["replicate", *src, out, "--dst-profile", "nope"], "profile"),
        (["replicate", str(tmp_path / "nothing"), out, "--shard", "0/2"], "stager index"),
        (["replicate", *src, out, "--watch", "--shard", "0/2"], "--watch"),
        (["replicate", *src, "s3://no-such-bucket/x", *flags("-d", b.options()), "--state-dir", str(tmp_path / "s")],
         "no-such-bucket"),
    ]
    for args, fragment in cases:
        code, err = in_process(args, capsys)
        lines = [line for line in err.splitlines() if line.strip()]
        usage = "4/4" in args  # a bad value of an option is a usage error: exit 2, as for any bad flag
        assert code == (2 if usage else 1) and len(lines) == 1 and lines[0].startswith("stager: error: "), (args, err)
        assert fragment in lines[0], lines[0]
    # And once as a real process: the same line, no traceback.
    assert_one_line_error(run(["replicate", *src, "https://example.com/x"]), "read-only")


def test_replicate_and_index_read_bin_files_alike(clusters, tmp_path):
    from stager.manifest import MANIFEST_PATH, read_manifest_file

    a, b = clusters
    src = a.root / "plain"
    src.mkdir(parents=True)
    (src / "tokens.bin").write_bytes(bytes(range(200)) * 10)  # 1,000 uint16 tokens
    (src / "odd.bin").write_bytes(b"x" * 7)
    done = run(["replicate", a.url("plain"), b.url("copy"), "--state-dir", str(tmp_path / "st"),
                *flags("-s", a.options()), *flags("-d", b.options())], check=True)
    assert "manifest written" in done.stdout
    replica = read_manifest_file(str(b.root / "copy" / MANIFEST_PATH))
    run(["index", str(b.root / "copy")], check=True)  # what `stager index` makes of the same files
    indexed = read_manifest_file(str(b.root / "copy" / MANIFEST_PATH))
    assert [(e.path, e.dtype, e.tokens) for e in replica] == [(e.path, e.dtype, e.tokens) for e in indexed]
    assert replica[replica.index_of("tokens.bin")].tokens == 1000
