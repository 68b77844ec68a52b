"""The inode table built from a manifest: names, attributes, lookups, walk order, conflicts."""

from __future__ import annotations

import pytest

from stager.fuse.tree import ROOT, Tree
from stager.errors import ManifestError
from stager.manifest import Manifest, ShardEntry

PATHS = ["b/x.bin", "a.txt", "a/z", "a/b/c", "a/b/a", "top", "a/c", "a/a", "b/y/deep/er/file", "\u00e9t\u00e9/\u65e5"]


def manifest_of(paths, mtimes=None) -> Manifest:
    return Manifest.from_entries([ShardEntry(p, 10 + i, f"{i:032x}", (i,), mtime=(mtimes or {}).get(p, 1000.0 + i))
                                  for i, p in enumerate(paths)], block_size=4096)


def walk(tree: Tree, inode: int = ROOT, prefix: str = ""):
    for child in tree.children(inode):
        path = prefix + tree.name(child).decode()
        if tree.is_dir(child):
            yield from walk(tree, child, path + "/")
        else:
            yield path, child


def test_the_tree_lists_every_path_of_the_manifest_with_its_size_and_mtime():
    m = manifest_of(PATHS)
    tree = Tree.from_manifest(m, now=5000.0)
    listed = dict(walk(tree))
    assert sorted(listed) == sorted(PATHS)
    for path, inode in listed.items():
        entry = m[m.index_of(path)]
        node = tree.node(inode)
        assert (node.size, node.mtime_ns, node.nlink, node.is_dir) == (entry.size, int(entry.mtime * 1e9), 1, False)
        assert tree.lookup_path(path) == inode
        assert tree.file_index(inode) == m.index_of(path)
    assert tree.node(tree.lookup_path("a")).nlink == 3  # ., .., b
    assert tree.node(ROOT).nlink == 2 + 3  # ., .. and the subdirectories a, b, été
    # a directory shows the newest file below it
    newest_under_b = max(m[m.index_of(p)].mtime for p in PATHS if p.startswith("b/"))
    assert tree.node(tree.lookup_path("b")).mtime_ns == int(newest_under_b * 1e9)
    assert tree.lookup(ROOT, b"missing") is None and tree.lookup(tree.lookup_path("top"), b"x") is None
    with pytest.raises(KeyError):
        tree.node(10_000)


def test_children_sort_as_bytes_and_the_walk_order_is_depth_first():
    m = manifest_of(PATHS)
    tree = Tree.from_manifest(m)
    assert [tree.name(c) for c in tree.children(ROOT)] == sorted(tree.name(c) for c in tree.children(ROOT))
    walked = [m.paths[i] for i in tree.order]
    assert walked == [path for path, _ in walk(tree)]  # the order a recursive walk over sorted names visits
    assert walked.index("a/b/c") < walked.index("a/c") < walked.index("a.txt") < walked.index("b/x.bin")
    assert all(tree.position(i) == walked.index(m.paths[i]) for i in range(len(m)))


def test_missing_mtimes_and_empty_manifests_show_now():
    tree = Tree.from_manifest(Manifest.from_entries([ShardEntry("d/f", 1, "0" * 32, (1,))]), now=1234.0)
    assert tree.node(tree.lookup_path("d/f")).mtime_ns == tree.node(ROOT).mtime_ns == 1234 * 10**9
    empty = Tree.from_manifest(Manifest.from_entries([]))
    assert empty.children(ROOT) == [] and len(empty.order) == 0


@pytest.mark.parametrize("paths, both", [
    (["a", "a/b"], "a"),
    (["x/y/z", "x/y"], "x/y"),
    (["k/a.txt", "k/a.txt/q", "k/b"], "k/a.txt"),
])
def test_a_name_that_is_both_a_file_and_a_directory_is_refused(paths, both):
    with pytest.raises(ManifestError, match=f"ds: '{both}' is both a file and a directory"):
        Tree.from_manifest(manifest_of(paths), name="ds")
