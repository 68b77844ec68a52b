"""What a layout module gives ``stager index``: the files it claims, and their token facts.

A layout (Megatron's ``.bin``/``.idx`` pairs, a Hugging Face ``save_to_disk``
folder, ...) is found from the listing and the layout's own index files,
read before the data is hashed. Each data file it claims may get a
:class:`Probe`, fed the file's bytes in order as they are hashed (so every
byte still crosses the network once), that checks the file against the
layout's index and counts its tokens. :meth:`DatasetLayout.describe` then
says what the manifest records: dtype, token count, reader and column.
"""

from __future__ import annotations

import abc
import asyncio
import json
import posixpath
from dataclasses import dataclass
from typing import TypeVar

from ...errors import ManifestError


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """What the manifest records of one shard for the iterator."""

    dtype: str | None = None
    tokens: int | None = None
    layout: str | None = None  # the reader (stager.manifest.model.LAYOUTS); None: by suffix
    column: str | None = None
    codec: str | None = None  # a compressed shard: its codec, decompressed size and digest (xxh3-128 hex)
    raw_size: int | None = None
    raw_digest: str | None = None


NOT_TOKENS = TokenInfo()


class Probe(abc.ABC):
    """Reads one shard's bytes as they are hashed, in order, once."""

    @abc.abstractmethod
    def feed(self, data: bytes) -> None:
        """The next bytes of the shard."""

    @abc.abstractmethod
    def finish(self) -> TokenInfo:
        """What the shard holds, once every byte was fed.

        Raises:
            ManifestError: the shard disagrees with its layout's index (names the file).
        """


class DatasetLayout(abc.ABC):
    """The files of one layout found in a listing."""

    name: str = ""

    @abc.abstractmethod
    def claims(self, path: str) -> bool:
        """Whether this layout describes the file at ``path``."""

    def probe(self, path: str, size: int) -> Probe | None:
        """A probe to feed the bytes of ``path`` to while hashing it, if this layout needs one."""
        return None

    @abc.abstractmethod
    async def describe(self, path: str, size: int, probe: Probe | None) -> TokenInfo:
        """The token facts of a claimed file (``NOT_TOKENS`` for the layout's index files).

        Raises:
            ManifestError: the file disagrees with the layout's index (names the file).
        """


_Indexed = TypeVar("_Indexed", bound="IndexedLayout")


class IndexedLayout(DatasetLayout):
    """A layout whose ``index.json`` files list its data files (LitData, MDS): each listed file is read
    by a probe made from its index entry while it is hashed, and described by what the probe found.

    ``entries`` maps a data file's path to (its ``index.json``'s path, its entry there, what else the
    layout's probe needs); subclasses say how a probe is made (:meth:`make_probe`).
    """

    title: str = ""  # the layout's name in messages ("MDS")

    def __init__(self, root: str, entries: dict[str, tuple[str, dict, object]]) -> None:
        self.root = root
        self.entries = entries

    @classmethod
    def found(cls: type[_Indexed], root: str, entries: dict, required: bool) -> _Indexed | None:
        """The layout of the files its indexes list under ``root``; None if there are none.

        Raises:
            ManifestError: none, and the layout was asked for (``--format``).
        """
        if not entries:
            if required:
                raise ManifestError(f"{root}: --format {cls.name}, but there is no {cls.title} index.json")
            return None
        return cls(root, entries)

    def claims(self, path: str) -> bool:
        return path in self.entries

    def probe(self, path: str, size: int) -> Probe | None:
        index, entry, extra = self.entries[path]
        return self.make_probe(f"{self.root}/{path}", f"{self.root}/{index}", entry, extra)

    @abc.abstractmethod
    def make_probe(self, name: str, index_name: str, entry: dict, extra: object) -> Probe:
        """The probe of one listed data file (``name``) from its entry in ``index_name``."""

    async def describe(self, path: str, size: int, probe: Probe | None) -> TokenInfo:
        assert probe is not None
        if getattr(probe, "inflates", False):  # decompresses the whole shard: off the event loop
            return await asyncio.to_thread(probe.finish)
        return probe.finish()


def read_index_json(name: str, data: bytes, sizes: dict[str, int], folder: str, data_files) -> object | None:
    """The content of an ``index.json``, or None when it is not JSON and nothing beside it looks like data.

    LitData and MDS both name their index ``index.json``; other tools use the name too. An
    unreadable one is refused only when files of the layout lie beside it (``data_files``: a
    predicate on a file name), where leaving it out would read those files as something else.

    Raises:
        ManifestError: it is not JSON, and data of the layout lies beside it.
    """
    try:
        return json.loads(data)
    except ValueError as exc:
        beside = [p for p in sizes if posixpath.dirname(p) == folder and data_files(posixpath.basename(p))]
        if beside:
            raise ManifestError(f"{name}: not valid JSON ({exc}), beside {beside[0]}") from exc
        return None
