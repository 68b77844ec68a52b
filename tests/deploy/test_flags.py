"""Every `stager` flag written in deploy/, docs/ and the README exists, by the real `--help` of its subcommand.

The commands are found as tests/deploy/invocations.py says; each subcommand's `--help` is run
once, in a subprocess, as a user would. A flag that is missing fails the test with the file,
the line and the flag, all of them at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import yaml

from tests.deploy.invocations import (Invocation, help_flags, help_subcommands, in_container, in_text,
                                      markdown_code)
from tests.deploy.manifests import REPO, containers, pod_spec

DEPLOY = REPO / "deploy"
DOCS = REPO / "docs"


@cache
def help_text(*subcommand: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}  # no config file of the caller's
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-m", "stager", *subcommand, "--help"], capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL, cwd=REPO, env=env)
    assert result.returncode == 0, f"stager {' '.join(subcommand)} --help exited {result.returncode}: {result.stderr}"
    return result.stdout


def subcommands() -> set[str]:
    """The top-level subcommands, and each group's own as "group sub"."""
    top = help_subcommands(help_text())
    nested = {f"{group} {sub}" for group in top for sub in help_subcommands(help_text(group))}
    return top | nested


def _relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def invocations() -> list[Invocation]:
    """Every `stager` command in the deploy files, the docs and the README."""
    subs = subcommands()
    found: list[Invocation] = []
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.suffix != ".json"):
        text = path.read_text()
        found += in_text(text, _relative(path), subs)
        if path.suffix == ".yaml" and path.name != "kustomization.yaml":
            for body in yaml.safe_load_all(text):
                spec = pod_spec(body) if body else None
                for container in containers(spec) if spec else []:
                    found += in_container(container, f"{_relative(path)} {body['kind']}/{body['metadata']['name']}", subs)
    for path in sorted(DOCS.rglob("*.md")) + [REPO / "README.md"]:
        for line, code in markdown_code(path.read_text()):
            found += in_text(code, _relative(path), subs, line)
    return found


def test_the_scan_finds_the_commands_it_should():
    found = invocations()
    where = {(i.where.split(":")[0].split(" ")[0], i.subcommand) for i in found}
    assert ("deploy/slurm/prolog.sh", "serve") in where
    assert ("deploy/kubernetes/daemonset.yaml", "serve") in where
    assert ("deploy/kubernetes/fuse/mount-daemonset.yaml", "mount") in where
    assert ("deploy/slurm/replicate.sbatch", "replicate") in where
    assert ("deploy/systemd/stager.service", "serve") in where
    assert ("README.md", "replicate") in where
    assert any(path.startswith("docs/") for path, _ in where)
    prolog = next(i for i in found if i.where.startswith("deploy/slurm/prolog.sh") and i.flags)
    assert {"--cache", "--socket", "--peers"} <= set(prolog.flags)


def test_every_flag_used_in_deploy_docs_and_the_readme_exists():
    top = help_flags(help_text())
    missing = []
    for invocation in invocations():
        known = help_flags(help_text(*invocation.subcommand.split()))
        missing += [f"{invocation.where}: `stager {invocation.subcommand} {flag}`: no such flag in "
                    f"`stager {invocation.subcommand} --help`" for flag in invocation.flags if flag not in known]
        missing += [f"{invocation.where}: `stager {flag} {invocation.subcommand}`: no such flag in `stager --help`"
                    for flag in invocation.global_flags if flag not in top]
    assert not missing, "\n".join(["flags that do not exist:", *missing])


def test_the_check_catches_a_flag_that_does_not_exist():
    (invocation,) = in_text("stager serve --cache /c --peerz x", "example", subcommands())
    assert "--peerz" not in help_flags(help_text("serve")) and "--cache" in help_flags(help_text("serve"))
    assert invocation.flags == ("--cache", "--peerz")
