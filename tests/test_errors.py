"""The one error tree: every exception class of the package lives in stager/errors.py and is drawn in its docstring."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import stager.errors as errors

ROOT = Path(__file__).resolve().parent.parent

#: Exception classes that stay inside one module on purpose: signals that never leave it (each is
#: translated at its layer's edge). The errors.py docstring names them too.
INTERNAL = {
    ("stager/store/wire.py", "ProtocolError"),
    ("stager/store/wire.py", "RedirectLoop"),
    ("stager/store/retry.py", "_AttemptTimedOut"),
    ("stager/cache/direct.py", "DirectRefused"),
}


def _exception_classes() -> set[str]:
    return {name for name, value in vars(errors).items()
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == errors.__name__}


def test_every_error_class_is_drawn_in_the_tree():
    drawn = errors.__doc__ or ""
    assert sorted(name for name in _exception_classes() if name not in drawn) == []
    assert sorted(_exception_classes() - set(errors.__all__)) == []


def test_no_exception_class_is_defined_outside_errors_py():
    known = {name for name in dir(builtins)
             if isinstance(getattr(builtins, name), type) and issubclass(getattr(builtins, name), BaseException)}
    known |= _exception_classes()
    outside = []
    for top in ("stager", "fuse"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel == "stager/errors.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if not isinstance(node, ast.ClassDef):
                    continue
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
                looks = node.name.endswith(("Error", "Exception")) or any(
                    b in known or b.endswith(("Error", "Exception")) for b in bases)
                if looks and (rel, node.name) not in INTERNAL:
                    outside.append(f"{rel}:{node.lineno} {node.name}")
    assert outside == []
