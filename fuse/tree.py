"""The mount's file tree, built once from the manifest: inodes, names, sizes, mtimes, walk order.

Everything ``ls``, ``stat`` and ``find`` ask is answered from here, so listing
never touches the origin. Inodes are arithmetic, not objects: the root is 1,
file ``i`` of the manifest is ``FIRST_FILE + i``, and directory ``d`` (in
order of creation, the root being 0) is ``FIRST_FILE + len(manifest) + d - 1``.
So a million shards cost a few arrays and no per-file object: the manifest's
paths are split into (directory, name) and sorted by (directory, name) with
Arrow kernels; only directories are Python objects. A directory's entries
(files and subdirectories merged by name) and its name index are built on
first use.

Names sort as bytes. The walk order -- every file in the order a depth-first
walk over sorted names visits it, which is what ``cp -r``, ``tar``, ``rsync``
and ``find`` do here -- is what read-ahead follows from one file to the next.

A manifest whose paths make one name both a file and a directory (``a`` and
``a/b``) is refused with a :class:`~stager.errors.ManifestError` naming it.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stager.errors import ManifestError
from stager.manifest import Manifest

ROOT = 1
FIRST_FILE = 2
DIR_SIZE = 4096


@dataclass(frozen=True, slots=True)
class Node:
    """What ``stat`` shows for one inode."""

    inode: int
    is_dir: bool
    size: int
    mtime_ns: int
    nlink: int


@dataclass(slots=True)
class _Dir:
    name: bytes
    path: str
    parent: int  # inode
    files: np.ndarray  # manifest indexes of the files directly inside, sorted by name
    subdirs: list[tuple[bytes, int]]  # (name, inode), sorted
    mtime_ns: int = -1
    entries: list[int] | None = None  # child inodes merged by name (built on first use)
    index: dict[bytes, int] | None = None  # name -> inode (built on first lookup)


def _encode(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


def _split(paths: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Each path's directory ('' at the root) and leaf name, with Arrow kernels."""
    rooted = pc.binary_join_element_wise("/", paths, "")  # "/" + path (the last argument is the separator)
    parts = pc.split_pattern(rooted, "/", max_splits=1, reverse=True)
    parent = pc.utf8_slice_codeunits(pc.list_element(parts, 0), 1)
    return parent, pc.list_element(parts, 1)


class Tree:
    """The read-only directory tree of one manifest. Build with :meth:`from_manifest`."""

    def __init__(self, manifest: Manifest, dirs: list[_Dir], file_mtime_ns: np.ndarray, order: np.ndarray,
                 name: str) -> None:
        self.manifest = manifest
        self.name_of_dataset = name
        self._files = len(manifest)
        self._dirs = dirs
        self._file_mtime_ns = file_mtime_ns
        self.order = order  # manifest indexes in walk order
        self._position = np.empty(len(order), dtype=np.int64)
        self._position[order] = np.arange(len(order), dtype=np.int64)

    # -- building ----------------------------------------------------------------------------

    @classmethod
    def from_manifest(cls, manifest: Manifest, *, name: str = "dataset", now: float | None = None) -> "Tree":
        """Build the tree of ``manifest`` (``name`` only appears in errors).

        Files without an mtime, and empty directories, show ``now`` (default: the current time);
        a directory shows the newest mtime of the files below it.

        Raises:
            ManifestError: a path is both a file and a directory.
        """
        now_ns = int((time.time() if now is None else now) * 1e9)
        files = len(manifest)
        mtimes = manifest.mtimes
        file_mtime_ns = np.where(np.isnan(mtimes), now_ns, np.nan_to_num(mtimes) * 1e9).astype(np.int64) \
            if files else np.zeros(0, np.int64)
        dirs = [_Dir(b"", "", ROOT, np.zeros(0, np.int64), [])]
        if files:
            cls._add_files(manifest, dirs, files)
        tree = cls(manifest, dirs, file_mtime_ns, np.zeros(0, np.int64), name)
        tree._check_and_merge()
        tree._dir_mtimes(now_ns)
        tree.order = tree._walk_order()
        tree._position = np.empty(files, dtype=np.int64)
        tree._position[tree.order] = np.arange(files, dtype=np.int64)
        return tree

    @staticmethod
    def _add_files(manifest: Manifest, dirs: list[_Dir], files: int) -> None:
        paths = manifest.table.column("path").combine_chunks()
        parent, leaf = _split(paths)
        encoded = pc.dictionary_encode(parent)
        parent_ids = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        by_dir = pc.sort_indices(pa.table({"d": parent_ids, "n": leaf}),
                                 sort_keys=[("d", "ascending"), ("n", "ascending")]).to_numpy()
        numbers: dict[str, int] = {"": 0}

        def make(path: str) -> int:
            number = numbers.get(path)
            if number is not None:
                return number
            up, _, leaf_name = path.rpartition("/")
            parent_number = make(up)
            number = len(dirs)
            numbers[path] = number
            dirs.append(_Dir(_encode(leaf_name), path, Tree._dir_inode(files, parent_number),
                             np.zeros(0, np.int64), []))
            dirs[parent_number].subdirs.append((_encode(leaf_name), Tree._dir_inode(files, number)))
            return number

        dir_of_parent = np.array([make(p.rstrip("/")) for p in encoded.dictionary.to_pylist()], dtype=np.int64)
        sorted_parents = parent_ids[by_dir]
        bounds = np.searchsorted(sorted_parents, np.arange(len(dir_of_parent) + 1))
        for pid, number in enumerate(dir_of_parent):
            dirs[number].files = by_dir[bounds[pid]:bounds[pid + 1]].astype(np.int64)
        for d in dirs:
            d.subdirs.sort()

    @staticmethod
    def _dir_inode(files: int, number: int) -> int:
        return ROOT if number == 0 else FIRST_FILE + files + number - 1

    def _file_name(self, index: int) -> bytes:
        return _encode(self.manifest.paths[index].rpartition("/")[2])

    def _check_and_merge(self) -> None:
        """Refuse a name that is both a file and a directory (only directories with subdirectories can
        have one); their entries are merged now, the others' on first use."""
        for d in self._dirs:
            if not d.subdirs or not len(d.files):
                continue
            names = [self._file_name(int(i)) for i in d.files]
            for sub_name, _ in d.subdirs:
                at = bisect.bisect_left(names, sub_name)
                if at < len(names) and names[at] == sub_name:
                    both = f"{d.path}/{sub_name.decode('utf-8', 'surrogateescape')}".lstrip("/")
                    raise ManifestError(f"{self.name_of_dataset}: '{both}' is both a file and a directory in "
                                        "the manifest; it cannot be mounted")
            d.entries = self._merge(d, names)

    def _merge(self, d: _Dir, names: list[bytes] | None = None) -> list[int]:
        files = (d.files + FIRST_FILE).tolist()
        if not d.subdirs:
            return files
        if names is None:
            names = [self._file_name(int(i)) for i in d.files]
        merged: list[int] = []
        at = 0
        for sub_name, inode in d.subdirs:
            upto = bisect.bisect_left(names, sub_name, at)
            merged.extend(files[at:upto])
            merged.append(inode)
            at = upto
        merged.extend(files[at:])
        return merged

    def _dir_mtimes(self, now_ns: int) -> None:
        """A directory shows its newest file below; directories are made after their parents, so one
        pass from the last made to the first carries each maximum up to the root."""
        for d in self._dirs:
            d.mtime_ns = int(self._file_mtime_ns[d.files].max()) if len(d.files) else -1
        for number in range(len(self._dirs) - 1, 0, -1):
            d = self._dirs[number]
            parent = self._dirs[self._dir_number(d.parent)]  # type: ignore[index]
            parent.mtime_ns = max(parent.mtime_ns, d.mtime_ns)
        for d in self._dirs:
            if d.mtime_ns < 0:
                d.mtime_ns = now_ns

    def _walk_order(self) -> np.ndarray:
        pieces: list[np.ndarray] = []
        stack: list[tuple[int, int]] = [(0, 0)]  # (directory number, next entry position)
        while stack:
            number, at = stack.pop()
            d = self._dirs[number]
            if not d.subdirs:
                pieces.append(d.files)
                continue
            entries = self.entries_of(number)
            run: list[int] = []
            while at < len(entries):
                child = entries[at]
                at += 1
                if child < FIRST_FILE + self._files:
                    run.append(child - FIRST_FILE)
                    continue
                stack.append((number, at))
                stack.append((self._dir_number(child), 0))  # type: ignore[arg-type]
                break
            pieces.append(np.asarray(run, dtype=np.int64))
        return np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, np.int64)

    # -- questions -----------------------------------------------------------------------------

    @property
    def files(self) -> int:
        return self._files

    @property
    def directories(self) -> int:
        return len(self._dirs)

    def _dir_number(self, inode: int) -> int | None:
        if inode == ROOT:
            return 0
        number = inode - FIRST_FILE - self._files + 1
        return number if 1 <= number < len(self._dirs) else None

    def entries_of(self, number: int) -> list[int]:
        d = self._dirs[number]
        if d.entries is None:
            d.entries = self._merge(d)
        return d.entries

    def is_dir(self, inode: int) -> bool:
        return self._dir_number(inode) is not None

    def file_index(self, inode: int) -> int | None:
        """The manifest index of a file inode; None for a directory or an unknown inode."""
        index = inode - FIRST_FILE
        return index if 0 <= index < self._files else None

    def inode_of_file(self, index: int) -> int:
        return FIRST_FILE + index

    def node(self, inode: int) -> Node:
        """The attributes of ``inode``. Raises KeyError for an unknown inode."""
        index = self.file_index(inode)
        if index is not None:
            return Node(inode, False, int(self.manifest.sizes[index]), int(self._file_mtime_ns[index]), 1)
        number = self._dir_number(inode)
        if number is None:
            raise KeyError(inode)
        d = self._dirs[number]
        return Node(inode, True, DIR_SIZE, d.mtime_ns, 2 + len(d.subdirs))

    def name(self, inode: int) -> bytes:
        """The entry name of ``inode`` (the root's is empty). Raises KeyError for an unknown inode."""
        index = self.file_index(inode)
        if index is not None:
            return self._file_name(index)
        number = self._dir_number(inode)
        if number is None:
            raise KeyError(inode)
        return self._dirs[number].name

    def children(self, inode: int) -> list[int]:
        """Child inodes of a directory, sorted by name. Raises KeyError if ``inode`` is not a directory."""
        number = self._dir_number(inode)
        if number is None:
            raise KeyError(inode)
        return self.entries_of(number)

    def lookup(self, parent: int, name: bytes) -> int | None:
        """The inode of ``name`` in directory ``parent``, or None."""
        number = self._dir_number(parent)
        if number is None:
            return None
        d = self._dirs[number]
        if d.index is None:
            d.index = {self.name(c): c for c in self.entries_of(number)}
        return d.index.get(name)

    def lookup_path(self, path: str) -> int:
        """The inode at a '/'-separated path relative to the root. Raises KeyError if absent."""
        inode = ROOT
        for part in filter(None, path.split("/")):
            found = self.lookup(inode, _encode(part))
            if found is None:
                raise KeyError(path)
            inode = found
        return inode

    @property
    def positions(self) -> np.ndarray:
        """The walk position of every manifest index."""
        return self._position

    def position(self, index: int) -> int:
        """Where file ``index`` comes in the walk order."""
        return int(self._position[index])
