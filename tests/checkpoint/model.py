"""A small deterministic state dict for checkpoint tests, and helpers to compare saved folders."""

from __future__ import annotations

from pathlib import Path

import torch


def state_dict(ranks: tuple[int, ...] = (0,), world: int = 1, scale: int = 1) -> dict:
    """The tensors of ``ranks`` of a ``world``, keyed per rank (so each rank writes its own files), and a step."""
    g = torch.Generator().manual_seed(1234)
    out: dict = {"step": 7}
    for r in range(world):
        tensors = {f"rank{r}.layer{i}": torch.randn(64 * scale, 128, generator=g) for i in range(4)}
        if r in ranks:
            out.update(tensors)
    return out


def empty_like(state: dict) -> dict:
    return {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0) for k, v in state.items()}


def data_files(folder: Path) -> dict[str, bytes]:
    """DCP's files of a checkpoint folder (``.metadata`` and ``*.distcp``), by name."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and
            (p.name == ".metadata" or p.suffix == ".distcp")}


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)
