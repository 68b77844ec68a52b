"""Every CLI error path the suite exercises: non-zero exit, one error line naming the culprit, never a
traceback.

The cases in ``REAL_PROCESS`` (one or more of each kind: flags, environment, config file, manifest,
origin, task group, a wait cut short) run as a real process, as users run the command; the others run
the same code from argv to exit in this process (see `run_here`), which is where their error is
handled, without paying an interpreter's start-up each.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Iterator

import pytest

from stager.manifest import MANIFEST_PATH
from tests.engine.corpus import make_corpus

from .runner import run, run_here

PROGRESS = re.compile(r"^(hashing|staging|replicating) ")

S3_KEYS = {"AWS_ACCESS_KEY_ID": "stagertest", "AWS_SECRET_ACCESS_KEY": "stagertestsecret"}

# (arguments, environment, what the error line must name); {placeholders} are filled in from `places`.
CASES = {
    # bad flags and values on the command line
    "capacity-one": (["stage", "{corpus}", "--cache", "{cache}", "--capacity", "1"], {}, "--capacity"),
    "capacity-fraction": (["stage", "{corpus}", "--cache", "{cache}", "--capacity", "0.5"], {}, "--capacity"),
    "capacity-word": (["stage", "{corpus}", "--cache", "{cache}", "--capacity", "lots"], {}, "--capacity"),
    # nan used to be taken, and then waited for ever on an origin that never answers
    "deadline-nan": (["stage", "{silent_url}", "--cache", "{cache}", "--retry-deadline", "nan"], {},
                     "--retry-deadline"),
    "deadline-inf": (["stage", "{corpus}", "--cache", "{cache}", "--retry-deadline", "inf"], {}, "--retry-deadline"),
    "deadline-negative": (["replicate", "{corpus}", "{dst}", "--retry-deadline", "-1"], {}, "--retry-deadline"),
    "bandwidth-zero": (["stage", "{corpus}", "--cache", "{cache}", "--bandwidth", "0"], {}, "--bandwidth"),
    "bandwidth-word": (["replicate", "{corpus}", "{dst}", "--bandwidth", "fast"], {}, "--bandwidth"),
    "concurrency-zero": (["stage", "{corpus}", "--cache", "{cache}", "--concurrency", "0"], {}, "--concurrency"),
    "limit-zero": (["stage", "{corpus}", "--cache", "{cache}", "--limit", "0"], {}, "--limit"),
    "window-zero": (["serve", "--cache", "{cache}", "--window", "0"], {}, "--window"),
    "ahead-seconds-zero": (["serve", "--cache", "{cache}", "--ahead-seconds", "0"], {}, "--ahead-seconds"),
    "ahead-seconds-env": (["serve", "--cache", "{cache}"], {"STAGER_AHEAD_SECONDS": "soon"}, "STAGER_AHEAD_SECONDS"),
    "lease-short": (["serve", "--cache", "{cache}", "--lease", "0.5"], {}, "--lease"),
    "drain-nan": (["serve", "--cache", "{cache}", "--drain-timeout", "nan"], {}, "--drain-timeout"),
    "metrics-address": (["serve", "--cache", "{cache}", "--socket", "{socket}", "--metrics-address", "nonsense"], {},
                        "--metrics-address"),
    # a mistyped --cache made an empty cache there, "verified" it and reported nothing bad (exit 0)
    "verify-no-cache": (["verify", "--cache", "{tmp}/no-such-cache"], {}, "no-such-cache"),
    "sample-zero": (["verify", "--cache", "{cache}", "--sample", "0"], {}, "--sample"),
    "sample-nan": (["verify", "--cache", "{cache}", "--sample", "nan"], {}, "--sample"),
    "block-size": (["index", "{corpus}", "--block-size", "1"], {}, "--block-size"),
    "part-size": (["replicate", "{corpus}", "{dst}", "--part-size", "10GB"], {}, "--part-size"),
    "interval-inf": (["replicate", "{corpus}", "{dst}", "--watch", "--interval", "inf"], {}, "--interval"),
    "shard": (["replicate", "{corpus}", "{dst}", "--shard", "5/2"], {}, "--shard"),
    "profile-without-config": (["replicate", "{corpus}", "{dst}", "--src-profile", "x"], {}, "--src-profile"),
    "watch-and-delete": (["replicate", "{corpus}", "{dst}", "--watch", "--delete"], {}, "--watch"),
    "demo-shards": (["demo", "--dir", "{tmp}/demo", "--shards", "0"], {}, "--shards"),
    "unknown-flag": (["stage", "{corpus}", "--capcity", "1GB"], {}, "--capcity"),
    "flag-value": (["stage", "{corpus}", "--no-hedge=3"], {}, "--no-hedge"),
    "missing-argument": (["stage"], {}, "SOURCE"),
    "unknown-command": (["stgae", "x"], {}, "stgae"),
    "cache-is-a-file": (["stage", "{corpus}", "--cache", "{file}"], {}, "--cache"),
    "storage-option": (["stage", "{corpus}", "--cache", "{cache}", "-o", "novalue"], {}, "--storage-option"),
    # bad environment variables
    "env-concurrency": (["stage", "{corpus}", "--cache", "{cache}"], {"STAGER_CONCURRENCY": "0"},
                        "STAGER_CONCURRENCY=0"),
    "env-capacity": (["status", "--cache", "{cache}"], {"STAGER_CAPACITY": "0.5"}, "STAGER_CAPACITY=0.5"),
    "env-bandwidth": (["stage", "{corpus}", "--cache", "{cache}"], {"STAGER_BANDWIDTH": "0"}, "STAGER_BANDWIDTH=0"),
    "env-deadline": (["stage", "{corpus}", "--cache", "{cache}"], {"STAGER_RETRY_DEADLINE": "nan"},
                     "STAGER_RETRY_DEADLINE=nan"),
    "env-flag": (["stage", "{corpus}", "--cache", "{cache}"], {"STAGER_DIRECT_WRITES": "maybe"},
                 "STAGER_DIRECT_WRITES=maybe"),
    "env-shard": (["replicate", "{corpus}", "{dst}"], {"STAGER_SHARD": "5/2"}, "STAGER_SHARD=5/2"),
    "env-metrics-address": (["serve", "--cache", "{cache}", "--socket", "{socket}"],
                            {"STAGER_METRICS_ADDRESS": "nonsense"}, "STAGER_METRICS_ADDRESS=nonsense"),
    "peers-without-listen": (["serve", "--cache", "{cache}", "--socket", "{socket}", "--peers", "slurm"], {},
                             "--peer-listen"),
    "peer-listen-bad": (["serve", "--cache", "{cache}", "--socket", "{socket}", "--peer-listen", "nowhere"], {},
                        "--peer-listen"),
    "peers-bad": (["serve", "--cache", "{cache}", "--socket", "{socket}", "--peer-listen", "127.0.0.1:7070",
                   "--peers", "a:b"], {}, "--peers"),
    "peer-no-secret": (["serve", "--cache", "{cache}", "--socket", "{socket}", "--peer-listen", "127.0.0.1:7070",
                        "--peers", "127.0.0.1:7070"], {}, "STAGER_PEER_SECRET"),
    "peer-secret-short": (["serve", "--cache", "{cache}", "--socket", "{socket}", "--peer-listen",
                           "127.0.0.1:7070", "--peers", "127.0.0.1:7070"], {"STAGER_PEER_SECRET": "short"},
                          "at least 16"),
    "peer-slurm-unset": (["serve", "--cache", "{cache}", "--socket", "{socket}", "--peer-listen", "127.0.0.1:7070",
                          "--peers", "slurm"], {"STAGER_PEER_SECRET": "s" * 32}, "SLURM_JOB_NODELIST"),
    "env-peer-bandwidth": (["serve", "--cache", "{cache}", "--socket", "{socket}"],
                           {"STAGER_PEER_BANDWIDTH": "fast"}, "STAGER_PEER_BANDWIDTH=fast"),
    "peer-tls-missing": (["serve", "--cache", "{cache}", "--socket", "{socket}", "--peer-listen", "127.0.0.1:7071",
                          "--peers", "127.0.0.1:7070", "--peer-tls-cert", "{tmp}/absent.pem", "--peer-tls-key",
                          "{tmp}/absent.key"], {"STAGER_PEER_SECRET": "s" * 32}, "--peer-tls-cert"),
    "env-config-missing": (["status", "--cache", "{cache}"], {"STAGER_CONFIG": "{tmp}/absent.toml"}, "absent.toml"),
    # bad config files
    "config-unknown-key": (["--config", "{conf_typo}", "status", "--cache", "{cache}"], {}, "'capcity'"),
    "config-unknown-table": (["--config", "{conf_table}", "status", "--cache", "{cache}"], {}, "[stgae]"),
    "config-wrong-type": (["--config", "{conf_type}", "status"], {}, "'cache'"),
    "config-bad-value": (["--config", "{conf_value}", "stage", "{corpus}"], {}, "[stage] key 'concurrency'"),
    "config-not-toml": (["--config", "{conf_broken}", "status"], {}, "TOML"),
    "config-missing": (["--config", "{tmp}/absent.toml", "status"], {}, "absent.toml"),
    "config-no-profile": (["--config", "{conf_value}", "replicate", "{corpus}", "{dst}", "--src-profile", "x"], {},
                          "[profiles.x]"),
    # bad sources, manifests and origins
    "no-manifest": (["stage", "{empty}", "--cache", "{cache}"], {}, "no manifest"),
    "no-manifest-check": (["index", "--check", "{empty}"], {}, "no manifest"),
    "bad-manifest": (["stage", "{bad_manifest}", "--cache", "{cache}"], {}, MANIFEST_PATH),
    "bad-manifest-check": (["index", "--check", "{bad_manifest}"], {}, MANIFEST_PATH),
    "checkpoints-keep-last": (["checkpoints", "prune", "{dst}", "--keep-last", "0"], {}, "--keep-last"),
    "checkpoints-no-manifest": (["checkpoints", "verify", "{empty}"], {}, "no good checkpoint manifest"),
    "unknown-protocol": (["stage", "nosuch://bucket/x", "--cache", "{cache}"], {}, "nosuch://"),
    "local-with-options": (["stage", "{corpus}", "--cache", "{cache}", "-o", "a=b"], {}, "storage options"),
    "origin-refused": (["stage", "{closed_url}", "--cache", "{cache}", "--retry-deadline", "0.5"], {},
                       "{closed_url}/" + MANIFEST_PATH),
    "s3-endpoint-refused": (["stage", "s3://bucket/corpus", "--cache", "{cache}", "--retry-deadline", "0.5", "-o",
                             "endpoint_url={closed_http}", "-o", "key=stagertest", "-o", "secret=stagertestsecret"],
                            {}, "endpoint {closed_http}"),
    # URLs a store cannot use: said before any request, naming where the URL came from
    "http-bad-ipv6": (["stage", "http://[::1/corpus", "--cache", "{cache}"], {}, "http://[::1/corpus"),
    "http-bad-port": (["stage", "http://127.0.0.1:99999/corpus", "--cache", "{cache}"], {}, "127.0.0.1:99999"),
    "http-no-host": (["stage", "http://", "--cache", "{cache}"], {}, "http://"),
    "s3-endpoint-env-bad": (["stage", "s3://bucket/corpus", "--cache", "{cache}"],
                            {"AWS_ENDPOINT_URL_S3": "http://[::1", **S3_KEYS}, "AWS_ENDPOINT_URL_S3=http://[::1"),
    "s3-endpoint-env-port": (["stage", "s3://bucket/corpus", "--cache", "{cache}"],
                             {"AWS_ENDPOINT_URL_S3": "", "AWS_ENDPOINT_URL": "http://127.0.0.1:99999", **S3_KEYS},
                             "AWS_ENDPOINT_URL=http://127.0.0.1:99999"),
    "s3-endpoint-option-scheme": (["stage", "s3://bucket/corpus", "--cache", "{cache}", "-o", "endpoint_url=ftp://x"],
                                  S3_KEYS, "endpoint_url=ftp://x"),
    "s3-no-bucket": (["stage", "s3://", "--cache", "{cache}"], {"AWS_ENDPOINT_URL_S3": "{closed_http}", **S3_KEYS},
                     "bucket"),
    "s3-option-not-a-table": (["stage", "s3://bucket/corpus", "--cache", "{cache}", "-o", "client_kwargs=abc"],
                              S3_KEYS, "client_kwargs"),
    "s3-nested-option-not-a-table": (["stage", "s3://bucket/corpus", "--cache", "{cache}", "-o",
                                      "config_kwargs.s3=abc"], S3_KEYS, "config_kwargs.s3"),
    # 's3://' lost its slashes and listed a local directory named 's3:': "no checkpoints", exit 0
    "checkpoints-no-bucket": (["checkpoints", "list", "s3://"], S3_KEYS, "bucket"),
    "fsspec-refuses-path": (["stage", "hf://x", "--cache", "{cache}"], {}, "hf://x"),
    "does-not-fit": (["stage", "{corpus}", "--cache", "{cache}", "--capacity", "400000B"], {}, "do not fit"),
    "too-large-for-cache": (["stage", "{corpus}", "--cache", "{cache}", "--capacity", "1000B"], {}, "larger than"),
    "index-task-group": (["index", "{odd}", "--concurrency", "4"], {}, "not a readable .npy file"),
    "replicate-no-manifest-http": (["replicate", "{closed_url}", "{dst}", "--retry-deadline", "0.5"], {},
                                   "{closed_url}"),
    "not-a-cache": (["status", "--cache", "{not_a_cache}"], {}, "not a stager cache"),
    "unmount-not-mounted": (["unmount", "{empty}"], {}, "not a mount point"),
}

REAL_PROCESS = {"deadline-nan", "unknown-flag", "unknown-command", "env-concurrency", "config-not-toml",
                "bad-manifest", "origin-refused", "s3-endpoint-refused", "s3-endpoint-env-bad", "index-task-group", "window-zero"}


@pytest.fixture(scope="module")
def silent_origin() -> Iterator[str]:
    """A loopback origin that takes connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/corpus"


@pytest.fixture(scope="module")
def places(tmp_path_factory, silent_origin) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("errors")
    make_corpus(tmp / "corpus", shards=2)
    (tmp / "empty").mkdir()
    (tmp / "bad" / ".stager").mkdir(parents=True)
    (tmp / "bad" / MANIFEST_PATH).write_bytes(b"not parquet at all")
    (tmp / "odd").mkdir()
    for i in range(3):
        (tmp / "odd" / f"s{i}.npy").write_bytes(b"notnumpy")  # not NumPy files, hashed in one task group
    (tmp / "not-a-cache").mkdir()
    (tmp / "not-a-cache" / "notes.txt").write_text("mine")
    (tmp / "file").write_text("a file")
    configs = {
        "conf_typo": 'capcity = "10MB"\n',
        "conf_table": "[stgae]\nconcurrency = 4\n",
        "conf_type": "cache = 42\n",
        "conf_value": "[stage]\nconcurrency = 0\n",
        "conf_broken": "cache = [unclosed\n",
    }
    for name, text in configs.items():
        (tmp / f"{name}.toml").write_text(text)
    with socket.socket() as closed:  # a loopback port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    return {
        "tmp": str(tmp), "corpus": str(tmp / "corpus"), "cache": str(tmp / "cache"), "dst": str(tmp / "dst"),
        "empty": str(tmp / "empty"), "bad_manifest": str(tmp / "bad"), "odd": str(tmp / "odd"),
        "not_a_cache": str(tmp / "not-a-cache"), "file": str(tmp / "file"), "socket": str(tmp / "s.sock"),
        "silent_url": silent_origin, "closed_url": f"http://127.0.0.1:{port}/corpus",
        "closed_http": f"http://127.0.0.1:{port}",
        **{name: str(tmp / f"{name}.toml") for name in configs},
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_error_is_one_line_naming_the_culprit_and_never_a_traceback(case, places, capsys):
    args, env, culprit = CASES[case]
    args = [a.format(**places) for a in args]
    env = {"STAGER_CONFIG": "", "XDG_CACHE_HOME": places["tmp"], **{k: v.format(**places) for k, v in env.items()}}
    result = run(args, env=env, timeout=60) if case in REAL_PROCESS else run_here(args, capsys, env)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode != 0, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip() and not PROGRESS.match(line)]
    assert len(lines) == 1 and lines[0].startswith("stager: error: "), result.stderr
    assert culprit.format(**places) in lines[0], lines[0]


def test_every_command_has_an_error_case():
    from stager.cli import COMMAND_MODULES

    named = {args[args.index("--config") + 2] if "--config" in args else args[0] for args, _, _ in CASES.values()
             if args}
    missing = set(COMMAND_MODULES) - named - {"mount"}  # mount: its FUSE tests run its error paths
    assert not missing, missing
    assert REAL_PROCESS <= set(CASES)
    assert Path(__file__).name.startswith("test_")
