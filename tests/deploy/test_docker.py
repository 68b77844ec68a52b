"""deploy/Dockerfile builds the project with its extras and fuse3, as a non-root user, with `stager` as ENTRYPOINT.

No image is built here (that needs a container engine and its base image); these checks read the
Dockerfile as the builder would: its instructions, the extras it installs against pyproject.toml,
and its build context through Dockerfile.dockerignore.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib

from tests.deploy.manifests import REPO

DOCKERFILE = REPO / "deploy" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in instructions():
        if instruction[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _ignored(path: str, rules: list[str]) -> bool:
    """Whether the build context leaves ``path`` out (the last matching rule wins, `!` includes again)."""
    ignored = False
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule[1:] if negate else rule
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(fnmatch.fnmatchcase(p, pattern) or fnmatch.fnmatchcase(p, pattern.replace("**/", "*/")) for p in prefixes):
            ignored = not negate
    return ignored


def test_the_image_runs_stager_as_a_user_that_is_not_root():
    final = _stages()[-1]
    entrypoint = [rest for word, rest in final if word == "ENTRYPOINT"][-1]
    assert json.loads(entrypoint) == ["stager"]
    user = [rest for word, rest in final if word == "USER"][-1]
    assert user not in ("root", "0") and not user.startswith("0:")


def test_the_image_installs_the_s3_fuse_and_torch_extras_and_fuse3():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installs = [rest for word, rest in instructions() if word == "RUN" and "pip install" in rest]
    wanted = re.search(r'"/src\[([a-z0-9,]+)\]"', " ".join(installs)).group(1).split(",")
    assert set(wanted) == {"s3", "fuse", "torch"} and set(wanted) <= set(extras)
    final_runs = " ".join(rest for word, rest in _stages()[-1] if word == "RUN")
    assert re.search(r"apt-get install .*\bfuse3\b", final_runs)
    # The torch build is a build argument: empty index = the default (CUDA) build, or a CPU-only index.
    args = {rest.split("=")[0] for word, rest in instructions() if word == "ARG"}
    assert {"TORCH_INDEX_URL", "TORCH_VERSION"} <= args


def test_everything_the_build_copies_is_in_the_build_context():
    rules = [line.strip().rstrip("/") for line in (REPO / "deploy" / "Dockerfile.dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    copied = []
    for word, rest in instructions():
        if word == "COPY" and "--from" not in rest:
            copied += shlex.split(rest)[:-1]
    assert {"pyproject.toml", "setup.py", "README.md", "stager", "fuse"} <= set(copied)
    for source in copied:
        assert (REPO / source).exists(), f"COPY {source}: not in the repository"
        assert not _ignored(source, rules), f"COPY {source}: left out of the build context by Dockerfile.dockerignore"
    for inside in ("stager/cli/__init__.py", "fuse/mount.py"):
        assert not _ignored(inside, rules)
    assert _ignored("tests/conftest.py", rules) and _ignored("benchmarks", rules) and _ignored(".venv", rules)
    assert _ignored("stager/__pycache__/x.pyc", rules)
