"""A checkpoint's manifest: every file's size and digests, and the stores that hold copies.

One small JSON document at ``.stager/checkpoint.json`` inside the checkpoint's
folder, at the destination and at every replica, written there last (after
DCP's ``.metadata``), so its presence means every byte before it was verified.
It holds, per file, the size, the xxh3-128 of the whole file and the xxh3-64 of
each block (stager's digests, :mod:`stager.hashing`), and the URLs of the
checkpoint's copies (destination first, then each replica), so that ``stager
checkpoints verify URL`` finds the replicas from the destination alone. The
document carries the xxh3-128 of its own canonical body; one that does not
match, or that breaks any structural rule, is refused with one line naming it.

Each data file's entry is made while the file is written (:class:`FileRecord`,
kept beside it in staging as ``.stager/files/NAME.json``), so a save hashes
each byte once, on its way to the disk.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from ..config import DEFAULT_BLOCK_SIZE
from ..errors import ManifestError
from ..hashing import StreamHasher, block_count
from ..manifest import Manifest, ShardEntry
from ..paths import BAD_PATH_PROBLEM, is_safe_path

MANIFEST_PATH = ".stager/checkpoint.json"
RECORDS_DIR = ".stager/files"
METADATA_NAME = ".metadata"
FORMAT = 1
_READ_CHUNK = 8 << 20


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One file of a checkpoint: relative path, size, xxh3-128 hex digest, xxh3-64 of each block."""

    path: str
    size: int
    digest: str
    blocks: tuple[int, ...]

    def to_json(self) -> dict:
        return {"path": self.path, "size": self.size, "digest": self.digest, "blocks": [f"{b:016x}" for b in self.blocks]}

    @classmethod
    def from_json(cls, obj: object, where: str, block_size: int) -> FileRecord:
        """A record parsed and checked; :class:`ManifestError` naming ``where`` when anything is off."""
        if not isinstance(obj, dict):
            raise ManifestError(f"{where}: a file entry must be an object, got {type(obj).__name__}")
        path, size, digest, blocks = obj.get("path"), obj.get("size"), obj.get("digest"), obj.get("blocks")
        if not isinstance(path, str) or not is_safe_path(path):
            raise ManifestError(f"{where}: file path {path!r}: {BAD_PATH_PROBLEM}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError(f"{where}: {path}: size must be a whole number >= 0, got {size!r}")
        if not isinstance(digest, str) or len(digest) != 32 or not _is_hex(digest):
            raise ManifestError(f"{where}: {path}: digest must be 32 hex digits, got {digest!r}")
        if not isinstance(blocks, list) or not all(isinstance(b, str) and len(b) == 16 and _is_hex(b) for b in blocks):
            raise ManifestError(f"{where}: {path}: blocks must be a list of 16-hex-digit digests")
        if len(blocks) != block_count(size, block_size):
            raise ManifestError(f"{where}: {path}: {len(blocks)} block digests for {size} bytes "
                                f"(blocks of {block_size} bytes need {block_count(size, block_size)})")
        return cls(path, size, digest, tuple(int(b, 16) for b in blocks))


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


@dataclass(frozen=True, slots=True)
class CheckpointManifest:
    """A checkpoint's files and stores (see the module docstring)."""

    files: tuple[FileRecord, ...]
    stores: tuple[str, ...] = ()  # destination first, then each replica
    block_size: int = DEFAULT_BLOCK_SIZE
    created: float = field(default_factory=time.time)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def file(self, path: str) -> FileRecord:
        for record in self.files:
            if record.path == path:
                return record
        raise KeyError(path)

    def data_files(self) -> list[FileRecord]:
        """The files sent first: all but DCP's ``.metadata``."""
        return [f for f in self.files if f.path != METADATA_NAME]

    def last_files(self) -> list[FileRecord]:
        """The files sent after every data file verified: DCP's ``.metadata`` when there is one."""
        return [f for f in self.files if f.path == METADATA_NAME]

    def encode(self) -> bytes:
        return encode_digested(self._body(), indent=1)

    def _body(self) -> dict:
        return {"format": FORMAT, "block_size": self.block_size, "created": self.created,
                "stores": list(self.stores), "files": [f.to_json() for f in sorted(self.files, key=lambda f: f.path)]}

    @classmethod
    def decode(cls, data: bytes, where: str) -> CheckpointManifest:
        """Parse and check a manifest's bytes.

        Raises:
            ManifestError: not JSON, a digest that does not match its body, an unknown format or a bad field.
        """
        obj = decode_digested(data, where, "checkpoint manifest", "manifest", FORMAT)
        block_size = obj.get("block_size")
        if not isinstance(block_size, int) or block_size <= 0:
            raise ManifestError(f"{where}: block_size must be a whole number > 0, got {block_size!r}")
        stores = obj.get("stores")
        if not isinstance(stores, list) or not all(isinstance(s, str) and s for s in stores):
            raise ManifestError(f"{where}: stores must be a list of URLs")
        created = obj.get("created")
        if not isinstance(created, (int, float)) or isinstance(created, bool):
            raise ManifestError(f"{where}: created must be a time in seconds, got {created!r}")
        files = obj.get("files")
        if not isinstance(files, list):
            raise ManifestError(f"{where}: files must be a list")
        records = tuple(FileRecord.from_json(f, where, block_size) for f in files)
        if len({r.path for r in records}) != len(records):
            raise ManifestError(f"{where}: a file is listed twice")
        return cls(records, tuple(stores), block_size, float(created))

    def to_manifest(self, records: list[FileRecord] | None = None) -> Manifest:
        """The files as a dataset manifest, for reading them through a cache session."""
        chosen = self.files if records is None else records
        return Manifest.from_entries((ShardEntry(r.path, r.size, r.digest, r.blocks) for r in chosen), self.block_size)


def encode_digested(body: dict, indent: int | None = None) -> bytes:
    """``body`` as JSON, with the xxh3-128 of its canonical form (sorted keys, no spaces) under ``digest``."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps({**body, "digest": xxhash.xxh3_128_hexdigest(text.encode())}, sort_keys=True,
                      indent=indent).encode()


def decode_digested(data: bytes, where: str, what: str, short: str, version: int) -> dict:
    """The JSON object of ``data`` (made by :func:`encode_digested`) once its digest and format check.

    Raises:
        ManifestError: naming ``where``: not a JSON object, a digest that does not match, another format.
    """
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{where}: not a {what} (not JSON: {exc})") from exc
    if not isinstance(obj, dict):
        raise ManifestError(f"{where}: not a {what} (not a JSON object)")
    claimed = obj.pop("digest", None)
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    if claimed != xxhash.xxh3_128_hexdigest(text.encode()):
        raise ManifestError(f"{where}: digest mismatch (the {short} is damaged)")
    if obj.get("format") != version:
        raise ManifestError(f"{where}: unknown {what} format {obj.get('format')!r} (this stager reads {version})")
    return obj


def hash_file(path: Path, name: str, block_size: int = DEFAULT_BLOCK_SIZE) -> FileRecord:
    """The record of a local file, reading it once."""
    hasher = StreamHasher(block_size)
    with open(path, "rb") as fh:
        while chunk := fh.read(_READ_CHUNK):
            hasher.update(chunk)
    digest, blocks = hasher.finish()
    return FileRecord(name, hasher.size, digest, tuple(blocks))


def write_record(folder: Path, record: FileRecord) -> None:
    """Keep ``record`` in ``folder/.stager/files/``, atomically and durably."""
    write_durably(folder / RECORDS_DIR / f"{record.path.replace('/', '%2F')}.json",
                  json.dumps(record.to_json()).encode())


def read_records(folder: Path, block_size: int = DEFAULT_BLOCK_SIZE) -> list[FileRecord]:
    """Every record kept in ``folder`` (made by :func:`write_record`), by path."""
    records = []
    directory = folder / RECORDS_DIR
    for item in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        where = str(item)
        try:
            obj = json.loads(item.read_bytes())
        except (OSError, ValueError) as exc:
            raise ManifestError(f"{where}: unreadable file record: {exc}") from exc
        records.append(FileRecord.from_json(obj, where, block_size))
    return sorted(records, key=lambda r: r.path)


def write_durably(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` by temp file, fsync and rename (and fsync the folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
