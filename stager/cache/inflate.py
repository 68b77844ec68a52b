"""The decompressed form of a compressed shard, made once into the cache and checked, then mapped.

A compressed MDS shard or LitData chunk is staged as it is: its blob is the
compressed file, fetched and verified like any other. The reader needs the
decompressed bytes, which the manifest describes (codec, ``raw_size``,
``raw_digest``, checked by ``stager index`` when it decompressed the shard
once). This module keeps that decompressed form as a blob of its own, named
by ``raw_digest``, in the same cache tier, so it goes through everything a
blob does: ``begin`` reserves its size against the capacity (evicting what
must go), its blocks are written and recorded, ``commit`` re-hashes the whole
file against ``raw_digest`` and renames it into ``blobs/`` (not fsynced: its
blocks are recorded without fdatasync, so a reboot makes readers hash it), and
eviction, ``stager verify`` and reconciliation treat it like any blob.
Content addressing makes it shared: two datasets (or two names) of the same
compressed bytes share one decompressed copy too.

Making one (:meth:`Inflater.open`), under the blob's cross-process lock, so
one process decompresses while the others (data loader workers, other jobs
on the node) wait and then map what it made:

1. decompress the verified compressed bytes once, hashing the whole stream
   (xxh3-128) and each block (xxh3-64): a stream that is truncated, corrupt,
   or hashes to other than ``raw_digest`` is refused before a byte is written
   (:class:`~stager.errors.CorruptData`, naming the shard);
2. reserve and write the blob with those block digests, decompressing a
   second time (memory stays at one block, whatever the shard's size), and
   commit it: the commit's re-hash is the check of the bytes on the disk.

Reading one maps it through :class:`~stager.cache.reader.VerifiedReads`, as
the iterator maps any blob: hashed against ``raw_digest`` the first time a
process maps it from the disk. A decompressed file that fails that check is
dropped through the cache's API and made again from the compressed blob;
never served. Where the cache has no room for it (a capacity smaller than
one decompressed shard) or cannot be written by this process, the
decompressed form is made in memory instead, checked the same way, and the
log says so.

A Parquet or Arrow token shard (codec ``parquet-tokens`` or ``arrow-tokens``,
:mod:`stager.manifest.layouts.decoded`) goes the same way: its "decompressed
form" is its token column decoded into flat tokens, which the iterator maps
like a flat ``.bin``. Decoding costs more than decompressing and the decoded
form of one file is small enough to hold, so it is decoded once, kept in
memory for both passes, and let go when the blob is committed.

Making one ahead (:meth:`Inflater.prepare`): the iterator asks for the
decompressed forms of the next window's shards whose blobs are staged
already, so the first read of a shard does not wait for its decompression,
hashing and write on a cold start; each is made on a thread of its
own, and :meth:`Inflater.open` waits for one being made instead of making it
again. One that fails ahead is made again by ``open``, which reports why.

Blocking work (decompression, decoding, hashing, disk writes): callers run it on their
own threads (the iterator's reading thread), never on an event loop.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import xxhash

from ..codecs import DECODED, decompress
from ..errors import BlobTooLarge, CacheCorrupt, CacheError, CacheFull, CorruptData
from ..hashing import block_count
from ..manifest.layouts.decoded import decoded_tokens
from .reader import VerifiedReads
from .tier import CacheTier

log = logging.getLogger(__name__)

AHEAD_WAIT = 600.0  # seconds open waits for a decompressed form being made ahead before making it itself
LOCK_TIMEOUT = 600.0  # seconds to wait for another process decompressing the same shard
ATTEMPTS = 3  # makes of one decompressed form (evicted or found bad right after) before giving up

Bytes = memoryview | bytes


@dataclass(frozen=True, slots=True)
class InflatedForm:
    """What the manifest says of a compressed shard's decompressed form.

    Attributes:
        name: the shard (for messages).
        codec: its codec (:data:`stager.codecs.CODECS`).
        size: the decompressed size.
        digest: the xxh3-128 of the decompressed bytes (its blob's name in the cache).
        block_size: the block size of its blob (the manifest's).
        column: a decoded token shard's column (:data:`stager.codecs.DECODED`; None for the others).
        dtype: a decoded token shard's dtype (the manifest's).
        stored: the dtype its decoded form holds the tokens in (None: ``dtype``; see
            :func:`stager.manifest.layouts.decoded.stored_dtype`).
    """

    name: str
    codec: str
    size: int
    digest: str
    block_size: int
    column: str | None = None
    dtype: str | None = None
    stored: str | None = None


@dataclass
class InflateStats:
    """How each decompressed form was had, for the iterator's stats and the tests."""

    made: int = 0  # decompressed into the cache
    reused: int = 0  # found in the cache
    remade: int = 0  # found bad on the disk (dropped), or evicted before it was mapped, and made again
    in_memory: int = 0  # decompressed into memory: no room for it in the cache, or the cache is read-only
    ahead: int = 0  # asked for ahead of its first read (prepare), and had so when it was read


@dataclass
class _Ahead:
    """A decompressed form being made ahead, on its own thread."""

    pid: int
    done: threading.Event = field(default_factory=threading.Event)
    data: "Bytes | None" = None  # set when made; None when it failed (open makes it again)


class Inflater:
    """Decompressed forms of compressed blobs, kept in the cache as blobs of their own. Thread-safe.

    Args:
        tier: the cache tier (called when first needed).
        complete_path: where a blob's complete file is (``CacheLayout.complete_path``).
        reads: the process's checks of the cache's files.
    """

    def __init__(self, tier: Callable[[], CacheTier], complete_path: Callable[[str], Path],
                 reads: VerifiedReads, *, lock_timeout: float = LOCK_TIMEOUT) -> None:
        self._tier = tier
        self._complete_path = complete_path
        self._reads = reads
        self._lock_timeout = lock_timeout
        self.stats = InflateStats()
        self._ahead: dict[str, _Ahead] = {}
        self._ahead_lock = threading.Lock()

    def prepare(self, wanted: "Sequence[tuple[InflatedForm, Callable[[], Bytes]]]") -> None:
        """Start making each form of ``wanted`` on a thread of its own, unless it is in the cache or being
        made already; forms made ahead before and never opened since are let go.

        Args:
            wanted: (form, compressed) pairs: what the manifest says of a decompressed form, and the
                shard's compressed bytes, verified (its blob should be staged already: the thread waits
                for nothing else). Whatever it or the making raises is logged and dropped: :meth:`open`
                makes the form again and raises it there.
        """
        pid = os.getpid()
        digests = {form.digest for form, _ in wanted}
        with self._ahead_lock:
            for digest in [d for d, slot in self._ahead.items()
                           if slot.pid != pid or (slot.done.is_set() and d not in digests)]:
                del self._ahead[digest]  # stale (never opened), or a parent process's
            for form, compressed in wanted:
                if form.digest in self._ahead or self._complete_path(form.digest).exists():
                    continue
                slot = self._ahead[form.digest] = _Ahead(pid)
                threading.Thread(target=self._make_ahead, args=(slot, form, compressed),
                                 name="stager-inflate-ahead", daemon=True).start()

    def _make_ahead(self, slot: _Ahead, form: InflatedForm, compressed: Callable[[], Bytes]) -> None:
        try:
            slot.data = self._open(form, compressed)
        except Exception as exc:  # noqa: BLE001 - reported by open(), which makes it again
            log.debug("%s: its decompressed form could not be made ahead: %s", form.name, exc)
        finally:
            slot.done.set()

    def open(self, form: InflatedForm, compressed: Callable[[], Bytes]) -> Bytes:
        """The verified decompressed bytes of a compressed shard: a read-only map of its cache file.

        Args:
            form: what the manifest says of the decompressed form.
            compressed: the shard's compressed bytes, verified (called only when the decompressed form
                must be made).

        Raises:
            CorruptData: the compressed bytes do not decompress to the manifest's size and digest.
            CacheError: the decompressed form kept being evicted or found bad as soon as it was made, or
                the cache's lock or files cannot be used.
            whatever ``compressed`` raises.
        """
        with self._ahead_lock:
            slot = self._ahead.get(form.digest)
        if slot is not None and slot.pid == os.getpid():
            slot.done.wait(AHEAD_WAIT)
            with self._ahead_lock:
                if self._ahead.get(form.digest) is slot and slot.done.is_set():
                    del self._ahead[form.digest]
            if slot.data is not None:
                self.stats.ahead += 1
                return slot.data
        return self._open(form, compressed)

    def _open(self, form: InflatedForm, compressed: Callable[[], Bytes]) -> Bytes:
        for _ in range(ATTEMPTS):
            path = self._complete_path(form.digest)
            if path.exists():
                data = self._map(form, path)
                if data is not None:
                    self.stats.reused += 1
                    return data
                self.stats.remade += 1
            try:
                made = self._make(form, compressed)
            except CacheCorrupt:  # its blocks changed on the disk before the commit (forgotten): write them again
                self.stats.remade += 1
                continue
            if isinstance(made, bytes):
                return made
            data = self._map(form, made)
            if data is not None:
                self.stats.made += 1
                return data
            self.stats.remade += 1
        raise CacheError(f"{form.name}: its decompressed form kept being evicted from the cache or found bad "
                         f"on its disk as soon as it was made ({ATTEMPTS} times)")

    def _map(self, form: InflatedForm, path: Path) -> Bytes | None:
        """The checked map of the decompressed file at ``path``; None if it is gone, or bad (then dropped)."""
        try:
            data, _ = self._reads.map_blob(path, form.digest, form.size)
        except FileNotFoundError:
            return None
        except CacheCorrupt as exc:
            log.warning("%s: its decompressed form %s changed on the cache disk; dropping it, to be made again",
                        form.name, form.digest)
            if exc.identity is not None:
                self._tier().drop_corrupt(form.digest, exc.identity)
            return None
        return data

    def _make(self, form: InflatedForm, compressed: Callable[[], Bytes]) -> Path | bytes:
        """Decompress the shard into the cache (or into memory, see the module docstring)."""
        try:
            tier = self._tier()
            lock = tier.lock(form.digest)
            if not lock.acquire(timeout=self._lock_timeout):
                raise CacheError(f"{form.name}: another process kept the lock of its decompressed form "
                                 f"{form.digest} for {self._lock_timeout:.0f} s")
        except CacheError as exc:
            return self._in_memory(form, self._decoded(form, compressed()), f"its cache cannot be used ({exc})")
        try:
            path = self._complete_path(form.digest)
            if path.exists():
                return path  # another process made it while this one waited
            data = self._decoded(form, compressed())
            blocks = self._block_digests(form, data)
            try:
                handle = tier.begin(form.digest, form.size, form.block_size, blocks, protect=())
            except (BlobTooLarge, CacheFull) as exc:
                return self._in_memory(form, data, f"no room for it in the cache ({exc})")
            try:
                self._write(form, data, handle)
                return handle.commit()
            finally:
                handle.close()
        finally:
            lock.release()

    def _decoded(self, form: InflatedForm, data: Bytes) -> Bytes | "_Decoded":
        """A token shard's decoded form, decoded once for both passes; other shards' bytes as they are."""
        if form.codec not in DECODED:
            return data
        produced, pieces = 0, []
        for values in decoded_tokens(form.codec, data, form.name, form.column or "", form.dtype,
                                     form.stored):
            produced += values.nbytes
            if produced > form.size:
                raise CorruptData(f"{form.name}: its token column decodes to more than the {form.size} bytes "
                                  f"the manifest says")
            pieces.append(memoryview(values).cast("B"))
        if produced != form.size:
            raise CorruptData(f"{form.name}: its token column decodes to {produced} bytes, the manifest says "
                              f"{form.size}")
        return _Decoded(pieces)

    def _pieces(self, form: InflatedForm, data: "Bytes | _Decoded"):
        if isinstance(data, _Decoded):  # checked to add up to the size already: in pieces of a block at most
            for whole in data.pieces:
                for start in range(0, len(whole), form.block_size):
                    yield whole[start:start + form.block_size]
            return
        try:
            yield from decompress(form.codec, data, form.size, piece=form.block_size)
        except ValueError as exc:
            raise CorruptData(f"{form.name}: its {form.codec} stream does not decompress to the "
                              f"{form.size} bytes the manifest says: {exc}") from exc

    def _blocks(self, form: InflatedForm, data: Bytes):
        """The decompressed bytes, one whole block at a time."""
        pending = bytearray()
        for piece in self._pieces(form, data):
            pending += piece
            while len(pending) >= form.block_size:
                yield bytes(pending[:form.block_size])
                del pending[:form.block_size]
        if pending or form.size == 0:
            yield bytes(pending)

    def _block_digests(self, form: InflatedForm, data: Bytes) -> list[int]:
        """The first pass: each block's xxh3-64, the whole stream checked against the manifest's digest.

        Raises:
            CorruptData: the stream does not decompress to the manifest's size and digest.
        """
        whole = xxhash.xxh3_128()
        blocks = []
        for block in self._blocks(form, data):
            whole.update(block)
            if block or form.size:
                blocks.append(xxhash.xxh3_64_intdigest(block))
        if whole.hexdigest() != form.digest:
            raise CorruptData(f"{form.name}: decompresses to bytes whose xxh3-128 is {whole.hexdigest()}, "
                              f"the manifest says {form.digest}")
        expected = block_count(form.size, form.block_size)
        if len(blocks) != expected:  # a size that decompress() checked; a guard for the cache's own books
            raise CorruptData(f"{form.name}: decompresses to {len(blocks)} blocks, not {expected}")
        return blocks

    def _write(self, form: InflatedForm, data: Bytes, handle) -> None:
        """The second pass: every block into the partial blob (its missing ones; a resumed blob keeps its
        verified blocks)."""
        missing = set(handle.missing_blocks())
        for index, block in enumerate(self._blocks(form, data)):
            if index in missing:
                handle.write_block(index, block, durable=False)

    def _in_memory(self, form: InflatedForm, data: Bytes, why: str) -> bytes:
        """The decompressed bytes in memory, checked against the manifest's digest."""
        log.warning("%s: decompressed in memory, not into the cache: %s", form.name, why)
        out = bytearray()
        for piece in self._pieces(form, data):
            out += piece
        if xxhash.xxh3_128_hexdigest(out) != form.digest:
            raise CorruptData(f"{form.name}: decompresses to bytes whose xxh3-128 is "
                              f"{xxhash.xxh3_128_hexdigest(out)}, the manifest says {form.digest}")
        self.stats.in_memory += 1
        return bytes(out)


@dataclass(frozen=True, slots=True)
class _Decoded:
    """A token shard's decoded form in memory: its flat tokens' bytes, a chunk per piece."""

    pieces: list[memoryview]


__all__ = ["InflateStats", "InflatedForm", "Inflater"]
