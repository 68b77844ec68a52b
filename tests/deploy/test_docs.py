"""The deployment docs point at things that exist: every test they cite, every file and link.

docs/failure-modes.md backs each claim with `tests/FILE.py::test_name`; a name that is not a
test function in that file (renamed, or never written) fails here, each one listed.
"""

from __future__ import annotations

import re

from tests.deploy.manifests import REPO

DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = DOCS + [REPO / "README.md"]


def test_the_deploying_pages_and_the_failure_modes_page_exist_and_the_readme_links_them():
    names = {p.name for p in DOCS}
    assert {"deploying-kubernetes.md", "deploying-slurm.md", "failure-modes.md"} <= names
    readme = (REPO / "README.md").read_text()
    deploying = readme.split("## Deploying\n", 1)[1].split("\n## ", 1)[0]
    for name in ("deploying-kubernetes.md", "deploying-slurm.md", "failure-modes.md"):
        assert f"(docs/{name})" in deploying


def test_every_test_the_docs_cite_exists():
    missing = []
    for page in PAGES:
        for path, name in sorted(set(re.findall(r"(tests/[\w/]+\.py)::(\w+)", page.read_text()))):
            source = REPO / path
            if not source.is_file():
                missing.append(f"{page.name}: {path}::{name}: no such file")
            elif not re.search(rf"^(?:async )?def {name}\(", source.read_text(), re.M):
                missing.append(f"{page.name}: {path}::{name}: no such test in {path}")
    assert not missing, "\n".join(["cited tests that do not exist:", *missing])


def test_every_claim_of_the_failure_modes_page_names_a_test():
    text = (REPO / "docs" / "failure-modes.md").read_text()
    for section in text.split("\n## ")[1:]:
        title = section.splitlines()[0]
        for paragraph in section.split("\n\n")[1:]:
            if paragraph.startswith("*What to do:*"):
                continue
            assert "::test_" in paragraph, f"failure-modes.md, {title!r}: a paragraph names no test:\n{paragraph}"


def test_every_file_and_link_the_docs_name_exists():
    missing = []
    for page in PAGES:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" not in target and not (page.parent / target).exists():
                missing.append(f"{page.name}: link {target}")
        for path in re.findall(r"(?<![\w/.])(deploy/[\w./-]*\w)", text):
            if not (REPO / path).exists():
                missing.append(f"{page.name}: {path}")
    assert not missing, "\n".join(missing)
