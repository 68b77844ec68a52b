"""A save whose ranks are on several nodes: its layout, and each node's part record at every store.

Each node holds its own ranks' files in its own staging directory; only rank
0's node holds DCP's ``.metadata``. The ranks that write into one staging
directory on one host are one *part* of the save (part 0 is rank 0's), and
:class:`SavePart` says which part a staging entry is, under which save id,
and the whole save's layout (every part's host and ranks); the entry of
part 0 also names every file ``.metadata`` refers to.

Each node's drain, once its part's data files are verified at a store,
writes there its :class:`PartRecord` (``.stager/parts/part-K.json``: the
save id, the part, the layout, each file's size and digests), carrying the
xxh3-128 of its own canonical body like the checkpoint's manifest. Part 0's
drain then waits until the part records at that store cover every file
``.metadata`` names (:func:`coverage`), and only then writes ``.metadata``
and the manifest (the union of the parts' files): a checkpoint is visible at
a store only once every byte from every node is verified there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..config import DEFAULT_BLOCK_SIZE
from ..errors import ManifestError
from .manifest import FileRecord, decode_digested, encode_digested

PARTS_DIR = ".stager/parts"
FORMAT = 1


def part_path(part: int) -> str:
    """Where part ``part``'s record lives in the checkpoint's folder at a store."""
    return f"{PARTS_DIR}/part-{part}.json"


@dataclass(frozen=True, slots=True)
class PartPlace:
    """One part of a save: its index, the host its staging directory is on, and its ranks."""

    part: int
    host: str
    ranks: tuple[int, ...]

    def describe(self) -> str:
        ranks = ",".join(str(r) for r in self.ranks)
        return f"part {self.part} (host {self.host}, rank{'s' if len(self.ranks) > 1 else ''} {ranks})"

    def to_json(self) -> dict:
        return {"part": self.part, "host": self.host, "ranks": list(self.ranks)}

    @classmethod
    def from_json(cls, obj: object, where: str) -> PartPlace:
        if not isinstance(obj, dict):
            raise ManifestError(f"{where}: a part must be an object, got {type(obj).__name__}")
        part, host, ranks = obj.get("part"), obj.get("host"), obj.get("ranks")
        if not isinstance(part, int) or isinstance(part, bool) or part < 0:
            raise ManifestError(f"{where}: part must be a whole number >= 0, got {part!r}")
        if not isinstance(host, str):
            raise ManifestError(f"{where}: part {part}: host must be a string, got {host!r}")
        if (not isinstance(ranks, list) or not ranks
                or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks)):
            raise ManifestError(f"{where}: part {part}: ranks must be a non-empty list of whole numbers")
        return cls(part, host, tuple(ranks))


def _layout_from_json(obj: object, where: str) -> tuple[PartPlace, ...]:
    if not isinstance(obj, list) or not obj:
        raise ManifestError(f"{where}: layout must be a non-empty list of parts")
    layout = tuple(PartPlace.from_json(p, where) for p in obj)
    if [p.part for p in layout] != list(range(len(layout))):
        raise ManifestError(f"{where}: layout must list parts 0..{len(layout) - 1} in order")
    return layout


@dataclass(frozen=True, slots=True)
class SavePart:
    """Which part of a multi-node save a staging entry holds (see the module docstring)."""

    save_id: str
    part: int
    layout: tuple[PartPlace, ...]
    expected: tuple[str, ...] = ()  # part 0 only: every file .metadata names

    @property
    def publishes(self) -> bool:
        """Whether this part's drain publishes the checkpoint (it holds ``.metadata``)."""
        return self.part == 0

    @property
    def place(self) -> PartPlace:
        return self.layout[self.part]

    def owner_of(self, name: str) -> PartPlace | None:
        """The part whose ranks wrote ``name`` (DCP names a rank's files ``__RANK_N.distcp``)."""
        head = name.split("_")
        if name.startswith("__") and len(head) > 3 and head[2].isdigit():
            rank = int(head[2])
            return next((p for p in self.layout if rank in p.ranks), None)
        return None

    def to_json(self) -> dict:
        return {"save_id": self.save_id, "part": self.part, "layout": [p.to_json() for p in self.layout],
                "expected": list(self.expected)}

    @classmethod
    def from_json(cls, obj: object, where: str) -> SavePart:
        if not isinstance(obj, dict):
            raise ManifestError(f"{where}: part must be an object")
        save_id, part, expected = obj.get("save_id"), obj.get("part"), obj.get("expected", [])
        if not isinstance(save_id, str) or not save_id:
            raise ManifestError(f"{where}: save_id must be a non-empty string, got {save_id!r}")
        layout = _layout_from_json(obj.get("layout"), where)
        if not isinstance(part, int) or isinstance(part, bool) or not 0 <= part < len(layout):
            raise ManifestError(f"{where}: part must be one of the layout's 0..{len(layout) - 1}, got {part!r}")
        if not isinstance(expected, list) or not all(isinstance(e, str) for e in expected):
            raise ManifestError(f"{where}: expected must be a list of file names")
        return cls(save_id, part, layout, tuple(expected))


@dataclass(frozen=True, slots=True)
class PartRecord:
    """What one node's drain verified at a store (see the module docstring)."""

    save_id: str
    part: int
    layout: tuple[PartPlace, ...]
    files: tuple[FileRecord, ...]
    block_size: int = DEFAULT_BLOCK_SIZE
    created: float = field(default_factory=time.time)

    @property
    def place(self) -> PartPlace:
        return self.layout[self.part]

    def _body(self) -> dict:
        return {"format": FORMAT, "save_id": self.save_id, "part": self.part, "block_size": self.block_size,
                "created": self.created, "layout": [p.to_json() for p in self.layout],
                "files": [f.to_json() for f in sorted(self.files, key=lambda f: f.path)]}

    def encode(self) -> bytes:
        return encode_digested(self._body())

    @classmethod
    def decode(cls, data: bytes, where: str) -> PartRecord:
        """Parse and check a part record's bytes.

        Raises:
            ManifestError: not JSON, a digest that does not match its body, an unknown format or a bad field.
        """
        obj = decode_digested(data, where, "part record", "part record", FORMAT)
        place = SavePart.from_json({**obj, "expected": []}, where)
        block_size, created, files = obj.get("block_size"), obj.get("created"), obj.get("files")
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
            raise ManifestError(f"{where}: block_size must be a whole number > 0, got {block_size!r}")
        if not isinstance(created, (int, float)) or isinstance(created, bool):
            raise ManifestError(f"{where}: created must be a time in seconds, got {created!r}")
        if not isinstance(files, list):
            raise ManifestError(f"{where}: files must be a list")
        records = tuple(FileRecord.from_json(f, where, block_size) for f in files)
        return cls(place.save_id, place.part, place.layout, records, block_size, float(created))


@dataclass(frozen=True, slots=True)
class Coverage:
    """How far the part records at one store cover a save: the files found, and the parts still missing."""

    files: dict[str, FileRecord]
    missing_files: tuple[str, ...]
    missing_parts: tuple[PartPlace, ...]

    @property
    def complete(self) -> bool:
        return not self.missing_files

    def describe(self) -> str:
        parts = ", ".join(p.describe() for p in self.missing_parts) or "no part record names them"
        return f"{len(self.missing_files)} file(s) not verified yet, from {parts}"


def coverage(save: SavePart, records: list[PartRecord], sizes: dict[str, int]) -> Coverage:
    """Which of ``save.expected`` the ``records`` of the same save cover, each file present at its size.

    ``sizes`` is the store's listing (path -> size): a file a record names but the store no
    longer holds at that size is not covered.
    """
    found: dict[str, FileRecord] = {}
    for record in records:
        if record.save_id != save.save_id:
            continue  # an earlier save to the same URL
        for f in record.files:
            if sizes.get(f.path) == f.size:
                found[f.path] = f
    missing = tuple(n for n in save.expected if n not in found)
    owners = {save.owner_of(n) for n in missing}
    parts = tuple(sorted((p for p in owners if p is not None), key=lambda p: p.part))
    return Coverage(found, missing, parts)
