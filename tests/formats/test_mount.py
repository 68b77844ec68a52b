"""The mount shows each layout as its native loader expects it, and the native loaders read it there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.fuse.mounts import Mount

from .golden import index
from .megatron_format import read_dataset, write_dataset

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".stager" not in p.parts}


@pytest.fixture
def mounted(tmp_path):
    mounts: list[Mount] = []

    def mount(source: Path) -> Path:
        m = Mount(str(source), tmp_path / f"m{len(mounts)}")
        mounts.append(m)
        return m.start().path

    yield mount
    for m in reversed(mounts):
        m.stop()


def test_every_layout_is_shown_as_written_and_native_loaders_read_it(tmp_path, capsys, mounted):
    import datasets

    datasets.disable_progress_bars()
    data = tmp_path / "data"
    rng = np.random.default_rng(2)
    rows = [rng.integers(0, 50000, 32).tolist() for _ in range(60)]
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(str(data / "hf"), num_shards=2)
    docs = [rng.integers(0, 50000, int(n)).astype(np.uint16) for n in rng.integers(1, 90, 30)]
    write_dataset(data / "megatron" / "corpus_text_document", docs)
    shutil.copytree(FIXTURES / "litdata" / "data", data / "litdata")
    shutil.copytree(FIXTURES / "litdata" / "data-batch", data / "litdata-batch")  # zstd frames: shown as written
    shutil.copytree(FIXTURES / "mds" / "fixed", data / "mds")
    manifest = index(data, capsys)
    assert {manifest.layouts[i] for i in range(len(manifest)) if manifest.tokens[i] >= 0} == \
           {"arrow", "megatron", "litdata", "mds"}

    mnt = mounted(data)
    assert tree(mnt) == tree(data)  # every data file and every layout's own index file, byte for byte
    loaded = datasets.load_from_disk(str(mnt / "hf"))  # Hugging Face's loader, through the mount
    assert [list(r["input_ids"]) for r in loaded] == rows
    back = read_dataset(mnt / "megatron" / "corpus_text_document")  # Megatron's reading, through the mount
    assert all(np.array_equal(a, b) for a, b in zip(back, docs)) and len(back) == len(docs)
    with pytest.raises(OSError):
        os.open(mnt / "mds" / "index.json", os.O_WRONLY)
