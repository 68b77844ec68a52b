"""The layers the README's architecture section draws, checked against every import under stager/ and fuse/.

Each part of the package (a top-level module or a sub-package of ``stager``, and
``fuse``, installed as ``stager.fuse``) sits in one layer. A module may import
its own part, any part of a lower layer, and nothing above it; the front ends
(one layer) never import each other. The imports are read with ``ast``, lazy
ones inside functions included, so a claim in the README cannot rot unseen.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Layers, lowest first; keep in step with the README's architecture section.
LAYERS: list[tuple[str, set[str]]] = [
    ("base", {"errors", "paths", "hashing", "codecs", "config", "progress", "event_loop", "aio", "diskio",
              "socket_path", "one_cpu", "open_files"}),
    ("core", {"manifest", "store", "cache", "write", "identity"}),
    ("engine", {"engine", "loopback"}),
    ("seam", {"session", "daemon_client", "testing", "cluster"}),
    ("front ends", {"daemon", "fuse", "iterator", "replicate", "demo"}),
    ("adapters", {"torch", "checkpoint"}),
    ("command", {"cli", "__main__", "stager"}),
]

#: Imports that cross a layer on purpose, each with its reason.
ALLOWED: dict[tuple[str, str], str] = {
    ("config", "cache"): "config's default cache directory keeps a legacy directory only if it holds a cache "
                         "(its format file's name); imported lazily",
    ("daemon", "checkpoint"): "the daemon runs the checkpoint drain queue when one runs (checkpoint/daemon_hook.py: "
                              "its route and its metrics); imported lazily, at start-up and when the route is built",
}

FRONT_ENDS = "front ends"


def _layer_of() -> dict[str, int]:
    return {part: rank for rank, (_, parts) in enumerate(LAYERS) for part in parts}


def _part(module: str) -> str:
    """``stager.cache.tier`` -> ``cache``; ``stager.fuse.mount`` -> ``fuse``; ``stager`` -> ``stager``."""
    names = module.split(".")
    if names[0] == "fuse":
        return "fuse"
    return names[1] if len(names) > 1 else "stager"


def _modules() -> list[tuple[str, Path]]:
    found = []
    for top, name in (("stager", "stager"), ("fuse", "stager.fuse")):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT / top).with_suffix("").parts
            parts = [p for p in rel if p != "__init__"]
            found.append((".".join([name, *parts]), path))
    return found


def _imports(module: str, path: Path) -> list[tuple[str, int]]:
    """Every ``stager...`` module that ``module`` imports (resolved from relative imports), with its line."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module is None or target in ("stager",):  # from .. import errors: the module errors
                out += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
            else:
                out.append((target, node.lineno))
    return [(t.replace("stager.fuse", "fuse", 1) if t.startswith("stager.fuse") else t, line)
            for t, line in out if t.split(".")[0] in ("stager", "fuse")]


def test_every_part_of_the_package_has_a_layer():
    layer = _layer_of()
    parts = {_part(module.replace("stager.fuse", "fuse", 1)) for module, _ in _modules()}
    assert parts - set(layer) == set(), "a new part: give it a layer here and in the README"


def test_no_module_imports_a_layer_above_it_and_no_front_end_imports_another():
    layer = _layer_of()
    front = next(rank for rank, (name, _) in enumerate(LAYERS) if name == FRONT_ENDS)
    wrong = []
    for module, path in _modules():
        mine = _part(module.replace("stager.fuse", "fuse", 1))
        for target, line in _imports(module, path):
            theirs = _part(target)
            if theirs == mine or (mine, theirs) in ALLOWED:
                continue
            where = f"{path.relative_to(ROOT)}:{line} imports {target}"
            if theirs not in layer:
                continue  # a name of the top-level package itself (``from .. import __version__``)
            if layer[theirs] > layer[mine]:
                wrong.append(f"{where}: {LAYERS[layer[theirs]][0]} is above {LAYERS[layer[mine]][0]}")
            elif layer[theirs] == layer[mine] == front:
                wrong.append(f"{where}: one front end imports another")
    assert wrong == []


def test_sessions_import_no_daemon_server_module():
    bad = [f"{path.relative_to(ROOT)}:{line} imports {target}"
           for module, path in _modules() if module.startswith(("stager.session", "stager.daemon_client"))
           for target, line in _imports(module, path) if target == "stager.daemon" or
           target.startswith("stager.daemon.")]
    assert bad == []


def test_shipped_code_imports_nothing_of_the_test_origins():
    bad = [f"{path.relative_to(ROOT)}:{line} imports {target}"
           for module, path in _modules() if not module.startswith("stager.testing")
           for target, line in _imports(module, path) if target.startswith("stager.testing")]
    assert bad == []
