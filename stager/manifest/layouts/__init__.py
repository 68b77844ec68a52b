"""Dataset layouts ``stager index`` reads in place: one module per layout.

==========  ===============================================  =======================================
layout      found by                                         token shards
==========  ===============================================  =======================================
files       file suffixes (always, for what no layout        ``.bin`` (``--dtype``), ``.npy``
            claims)
parquet     ``.parquet`` files (always)                      each with a token column of any shape
megatron    ``PREFIX.idx`` beside ``PREFIX.bin``             the ``.bin``, dtype from the ``.idx``
arrow       ``.arrow`` files (Hugging Face ``save_to_disk``  each ``.arrow`` with a token column
            folders, with their ``state.json``)
litdata     ``index.json`` with ``chunks`` and ``config``    each chunk (``TokensLoader`` tokens, or
                                                             zstd-framed ``PyTreeLoader`` documents)
mds         ``index.json`` with ``version: 2``, ``shards``   each ``.mds`` shard's token column
==========  ===============================================  =======================================

``--format auto`` (the default) looks for every layout; ``--format NAME``
looks for that one only, and it must be there; ``--format files`` looks for
none (suffix rules only). Parquet files are read by their footer in every
case. Every file is a shard, the layouts' own index
files too (so the mount shows the dataset as its native loader expects it);
a layout only says what the iterator needs of its token shards: dtype, token
count, reader (``layout``) and token column, and for a compressed shard, or a
Parquet or Arrow token column decoded once into flat tokens (:mod:`.decoded`),
the codec, size and digest of the form the iterator reads. The layout's index files are
read before hashing and checked against the listing; its data files are
checked against them as they are hashed. A file that disagrees is refused
with a :class:`~stager.errors.ManifestError` naming it.
"""

from __future__ import annotations

from ...errors import ConfigError, ManifestError
from . import arrow, litdata, mds, megatron
from .base import NOT_TOKENS, DatasetLayout, Probe, TokenInfo
from .columns import INTEGER_DTYPES, candidates, find_column, flat_values, parquet_tokens
from .parquet import ParquetLayout

#: What ``--format`` accepts.
FORMATS = ("auto", "files", "parquet", "megatron", "arrow", "litdata", "mds")


class Layouts:
    """The layouts found in one listing; routes each file to the layout that claims it."""

    def __init__(self, found: list[DatasetLayout]) -> None:
        self.found = found

    def _owner(self, path: str) -> DatasetLayout | None:
        return next((layout for layout in self.found if layout.claims(path)), None)

    def probe(self, path: str, size: int) -> Probe | None:
        """A probe for the bytes of ``path``, when its layout needs to see them."""
        owner = self._owner(path)
        return owner.probe(path, size) if owner is not None else None

    async def describe(self, path: str, size: int, probe: Probe | None) -> TokenInfo | None:
        """The token facts of ``path`` from its layout; None when no layout claims it (suffix rules)."""
        owner = self._owner(path)
        return await owner.describe(path, size, probe) if owner is not None else None


async def find_layouts(store, sizes: dict[str, int], fmt: str = "auto", column: str | None = None) -> Layouts:
    """The layouts of the files ``sizes`` (path -> size) under ``store``, their index files checked.

    Raises:
        ConfigError: an unknown ``fmt``.
        ManifestError: ``fmt`` names a layout that is not there, or a layout's index is bad.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    found: list[DatasetLayout] = []
    if fmt in ("auto", "litdata"):  # first: its chunks are .bin files, which are no Megatron data
        chunks = await litdata.find(store, sizes, fmt == "litdata")
        if chunks is not None:
            found.append(chunks)
    if fmt in ("auto", "mds"):
        shards = await mds.find(store, sizes, column, fmt == "mds")
        if shards is not None:
            found.append(shards)
    if fmt in ("auto", "megatron"):
        pairs = await megatron.find(store, sizes, fmt == "megatron")
        if pairs is not None:
            lone = next((p for p in sizes if p.endswith(".bin") and not any(f.claims(p) for f in (*found, pairs))),
                        None)
            if lone is not None:
                raise ManifestError(f"{store.url.rstrip('/')}/{lone}: no {lone[:-4]}.idx beside it, "
                                    f"but this dataset's other .bin files are Megatron's")
            found.append(pairs)
    if fmt in ("auto", "arrow"):
        streams = await arrow.find(store, sizes, column, fmt == "arrow")
        if streams is not None:
            found.append(streams)
    if fmt == "parquet" and not any(p.endswith(".parquet") for p in sizes):
        raise ManifestError(f"{store.url.rstrip('/')}: --format parquet, but there is no .parquet file")
    found.append(ParquetLayout(store, column))  # every layout may sit beside Parquet files
    return Layouts(found)


__all__ = [
    "FORMATS",
    "INTEGER_DTYPES",
    "NOT_TOKENS",
    "DatasetLayout",
    "Layouts",
    "Probe",
    "TokenInfo",
    "candidates",
    "find_column",
    "find_layouts",
    "flat_values",
    "parquet_tokens",
]
