"""The drain journal: what each store already holds, verified, surviving SIGKILL.

An append-only file of JSON lines in the checkpoint's staging folder
(``.stager/journal``), each line written and fsynced before the drain counts
its step done: a file verified at a store, a multipart upload begun (with the
store's resume token), a part of it written, and, for rank 0's node of a save
whose ranks are on several nodes, which other nodes' parts (and files) it is
waiting for at a store. A drain killed at any instant and
started again replays the journal and sends only what was not recorded; a
torn last line (the kill came mid-write) is ignored. Appends run in a thread,
so the event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

JOURNAL = ".stager/journal"


class DrainJournal:
    """The journal of one staging entry (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / JOURNAL
        self.verified: set[tuple[int, str, str]] = set()  # (store, path, digest)
        self.uploads: dict[tuple[int, str, str], tuple[str, int]] = {}  # -> (token, part size)
        self.parts: dict[tuple[int, str, str], dict[int, int]] = {}  # -> {part number: size}
        self.awaiting: dict[int, tuple[list[int], list[str]]] = {}  # store -> (nodes' parts, files) still missing
        self._lock = threading.Lock()
        self._replay()

    def _replay(self) -> None:
        try:
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                rec = json.loads(line)
                if rec.get("kind") == "awaiting":
                    self.awaiting[int(rec["store"])] = ([int(p) for p in rec["parts"]], [str(f) for f in rec["files"]])
                    continue
                key = (int(rec["store"]), str(rec["path"]), str(rec["digest"]))
                kind = rec["kind"]
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # a line torn by a kill: what it said is done again
            if kind == "verified":
                self.verified.add(key)
            elif kind == "upload":
                self.uploads[key] = (str(rec["token"]), int(rec["part_size"]))
                self.parts[key] = {}
            elif kind == "part" and key in self.uploads:
                self.parts[key][int(rec["number"])] = int(rec["size"])

    def is_verified(self, store: int, path: str, digest: str) -> bool:
        return (store, path, digest) in self.verified

    async def mark_verified(self, store: int, path: str, digest: str) -> None:
        await self._append({"kind": "verified", "store": store, "path": path, "digest": digest})
        self.verified.add((store, path, digest))
        self.uploads.pop((store, path, digest), None)

    async def mark_upload(self, store: int, path: str, digest: str, token: str, part_size: int) -> None:
        await self._append({"kind": "upload", "store": store, "path": path, "digest": digest,
                            "token": token, "part_size": part_size})
        self.uploads[(store, path, digest)] = (token, part_size)
        self.parts[(store, path, digest)] = {}

    async def mark_part(self, store: int, path: str, digest: str, number: int, size: int) -> None:
        await self._append({"kind": "part", "store": store, "path": path, "digest": digest,
                            "number": number, "size": size})
        self.parts.setdefault((store, path, digest), {})[number] = size

    async def mark_awaiting(self, store: int, parts: list[int], files: list[str]) -> None:
        """Rank 0's node of a multi-node save waits at ``store`` for these parts' ``files`` (journaled on change)."""
        if self.awaiting.get(store) == (parts, files):
            return
        await self._append({"kind": "awaiting", "store": store, "parts": parts, "files": files})
        self.awaiting[store] = (parts, files)

    def forget_upload(self, store: int, path: str, digest: str) -> None:
        """An upload that is gone at the store: start a new one (its next record replaces it)."""
        self.uploads.pop((store, path, digest), None)
        self.parts.pop((store, path, digest), None)

    async def _append(self, record: dict) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        await asyncio.to_thread(self._write, line)

    def _write(self, line: bytes) -> None:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
