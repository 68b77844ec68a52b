"""Arrow IPC stream files (``.arrow``): Hugging Face ``datasets`` folders and any other.

``Dataset.save_to_disk`` writes ``data-NNNNN-of-NNNNN.arrow`` files (Arrow IPC
*streams*: a schema message, then record batches, then an end marker),
``state.json`` (whose ``_data_files`` lists them, in order) and
``dataset_info.json``. Every ``.arrow`` file whose schema has a token column
(``--token-column``, by default ``tokens`` or else ``input_ids``: a list,
large list or fixed-size list of integers) is a token shard; a ``state.json``
that names a file the folder lacks is refused.

The token count needs the data: a :class:`ArrowStreamProbe` follows the stream
as it is hashed, one message at a time (the framing is an 8-byte prefix, the
flatbuffer metadata, and a body whose length the metadata holds), and counts
each batch's tokens with the rules the reader uses (:mod:`.columns`). An
Arrow IPC *file* (Feather v2: ``ARROW1`` magic, the same stream, a footer) is
read the same way, past its magic. The probe also hashes each batch's tokens
as it counts them: the manifest records the file's decoded form (codec
``arrow-tokens``, :mod:`.decoded`), which the iterator maps as flat tokens
instead of joining the batches at every open.
"""

from __future__ import annotations

import json
import posixpath
import struct

import pyarrow as pa

from ...errors import CorruptData, ManifestError
from .base import NOT_TOKENS, DatasetLayout, Probe, TokenInfo
from .columns import find_column, flat_values
from .decoded import DecodedMeasure

CONTINUATION = 0xFFFFFFFF
FILE_MAGIC = b"ARROW1"


def _body_length(metadata: bytes | bytearray | memoryview) -> int:
    """``bodyLength`` of an IPC ``Message`` flatbuffer (field 3 of its root table; 0 when absent)."""
    table = struct.unpack_from("<I", metadata, 0)[0]
    vtable = table - struct.unpack_from("<i", metadata, table)[0]
    vtable_size = struct.unpack_from("<H", metadata, vtable)[0]
    field = 4 + 2 * 3
    if vtable_size <= field:
        return 0
    offset = struct.unpack_from("<H", metadata, vtable + field)[0]
    return struct.unpack_from("<q", metadata, table + offset)[0] if offset else 0


class ArrowStreamProbe(Probe):
    """Counts the tokens of an Arrow IPC stream as its bytes go by, one message in memory at a time."""

    def __init__(self, name: str, column: str | None) -> None:
        self.name, self.wanted = name, column
        self.buffer = bytearray()
        self.message_end: int | None = None  # bytes of the message being gathered, once its header is in
        self.schema: pa.Schema | None = None
        self.found: tuple[str, str] | None = None
        self.tokens = 0
        self.measure = DecodedMeasure()  # the decoded form's size and digest
        self.ended = False
        self.failure: str | None = None

    def feed(self, data: bytes) -> None:
        if self.ended or self.failure:
            return
        self.buffer += data
        try:
            self._drain()
        except (pa.ArrowException, OSError, struct.error, ValueError, IndexError, KeyError) as exc:
            self.failure = f"not a readable Arrow IPC stream: {exc}"

    def _drain(self) -> None:
        buf = self.buffer
        if self.schema is None and self.message_end is None and buf[:6] == FILE_MAGIC[:min(6, len(buf))]:
            if len(buf) < 8:
                return
            del buf[:8]  # the IPC file format: magic and padding, then the same stream (the footer follows it)
        while not self.ended:
            if self.message_end is None:
                if len(buf) < 8:
                    return
                first, length = struct.unpack_from("<Ii", buf, 0)
                prefix = 8
                if first != CONTINUATION:  # the pre-1.0 framing: no continuation marker
                    prefix, length = 4, struct.unpack_from("<i", buf, 0)[0]
                if length == 0:
                    self.ended = True
                    return
                if length < 0:
                    raise ValueError(f"negative metadata length {length}")
                if len(buf) < prefix + length:
                    return
                body = _body_length(memoryview(buf)[prefix:prefix + length])
                if body < 0:
                    raise ValueError(f"negative body length {body}")
                self.message_end = prefix + length + body
            if len(buf) < self.message_end:
                return
            self._message(pa.ipc.read_message(pa.py_buffer(bytes(buf[:self.message_end]))))
            del buf[:self.message_end]
            self.message_end = None

    def _message(self, message: pa.ipc.Message) -> None:
        if self.schema is None:
            self.schema = pa.ipc.read_schema(message)
            self.found = find_column(self.schema, self.wanted)
            if self.found is None:
                self.ended = True  # no token column: nothing more to learn from this file
            return
        if message.type != "record batch":
            return  # dictionary batches belong to other columns
        batch = pa.ipc.read_record_batch(message, self.schema)
        name = self.found[0]
        try:
            values = flat_values(batch.column(name), self.name, name)
        except CorruptData as exc:
            raise ValueError(str(exc).removeprefix(f"{self.name}: ")) from exc
        self.tokens += len(values)
        self.measure.update(values)

    def finish(self) -> TokenInfo:
        if self.failure:
            raise ManifestError(f"{self.name}: {self.failure}")
        if self.schema is None:  # not even a schema: a file named .arrow that is no stream, or a cut one
            raise ManifestError(f"{self.name}: not a readable Arrow IPC stream (no schema message; truncated?)")
        if self.found is not None and not self.ended:
            raise ManifestError(f"{self.name}: the Arrow stream ends early (truncated)")
        if self.found is None:
            return NOT_TOKENS
        column, dtype = self.found
        return TokenInfo(dtype, self.tokens, "arrow", column, "arrow-tokens", self.measure.size,
                         self.measure.digest.hexdigest())


class ArrowLayout(DatasetLayout):
    """Every ``.arrow`` file of a listing, and the ``state.json`` files that list them."""

    name = "arrow"

    def __init__(self, root: str, column: str | None) -> None:
        self.root, self.column = root, column

    def claims(self, path: str) -> bool:
        return path.endswith(".arrow")

    def probe(self, path: str, size: int) -> Probe | None:
        return ArrowStreamProbe(f"{self.root}/{path}", self.column)

    async def describe(self, path: str, size: int, probe: Probe | None) -> TokenInfo:
        assert probe is not None
        return probe.finish()


async def find(store, sizes: dict[str, int], column: str | None, required: bool) -> ArrowLayout | None:
    """The Arrow layout of a listing (path -> size), its ``state.json`` files checked.

    Raises:
        ManifestError: a ``state.json`` that is unreadable or names a missing file; with
            ``required``, no ``.arrow`` file at all.
    """
    root = store.url.rstrip("/")
    arrows = [p for p in sizes if p.endswith(".arrow")]
    if not arrows:
        if required:
            raise ManifestError(f"{root}: --format arrow, but there is no .arrow file")
        return None
    for state in (p for p in sizes if posixpath.basename(p) == "state.json"):
        try:
            listed = json.loads(await store.read(state))["_data_files"]
            files = [posixpath.join(posixpath.dirname(state), f["filename"]) for f in listed]
        except (ValueError, KeyError, TypeError) as exc:
            raise ManifestError(f"{root}/{state}: not a Hugging Face dataset state ({exc})") from exc
        missing = [f for f in files if f not in sizes]
        if missing:
            raise ManifestError(f"{root}/{state}: lists {missing[0]}, which is not there")
    return ArrowLayout(root, column)
