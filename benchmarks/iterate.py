"""Feeding a training loop: stager's TokenDataset vs memmap slicing, MosaicML streaming and LitData.

One run, one corpus (uint16 token shards whose tokens count up, so any sample
can be checked: its tokens must be consecutive modulo 2**16), every contender
in its own process, side by side:

(a) **warm**: the data already on local disk (stager's cache staged, the
    peers' local copies complete). Sequences/s of batches of ``--batch``
    sequences of ``--seq-len`` tokens, shuffled, one process, no workers:
    - ``memmap``: the limit, random windows of the shard files copied with
      NumPy into one batch (what any loader must at least do);
    - ``stager``: ``TokenDataset(batch_size=B, batches=True)`` iterated as is
      (int64 tensors of shape (B, seq_len), the memmap contender's output);
    - ``stager per-sample``: ``TokenDataset`` with ``DataLoader(batch_size=B)``
      (the classic API: per-sample tensors collated by torch in the loop);
    - MosaicML ``StreamingDataset`` (MDS shards) and LitData ``StreamingDataset``
      (``TokensLoader`` chunks), each with its own loader at batch ``B``.
(b) **cold**: an empty cache, the origin is ``rclone serve s3`` behind the
    fault proxy (latency, spikes, 503 SlowDown, 500, resets, flipped bytes,
    and a bandwidth cap); the training loop "computes" for a fixed time per
    step so it consumes at ``--consume`` x the origin bandwidth, and each
    loader makes its batches in one DataLoader worker process, as in
    training. For each of stager, MosaicML, LitData and a naive s3fs reader
    (``naive``: each sample one ranged GET, in the loop's process, nothing
    read ahead; it runs at most ``NAIVE_STEPS`` steps, a second or so each):
    time to first batch, time blocked in ``next()``, the stall fraction after
    the first batch (blocked / elapsed), p99 wait per step, the bytes the
    origin sent per byte the loop consumed (counted at the proxy), and how
    many samples had wrong tokens.

(c) **layouts read in place**: the same corpus as a Hugging Face ``save_to_disk``
    folder, as Hub-style Parquet files (an ``input_ids`` ``list<int32>`` column)
    and as Megatron-LM ``.bin``/``.idx`` pairs (written by ``datasets`` and
    megatron-core, both in stager's test extra), and as the MDS (also with zstd
    shards) and LitData copies of (a) and (b) when the peers can run: stager
    over each layout (``stager index`` finds it; one window is one of the
    layout's samples) against stager's own flat ``.bin`` figure of the same
    round and the layout's native loader over the same files (``datasets``
    with torch format and a shuffling DataLoader, ``load_from_disk`` or
    ``load_dataset("parquet")``; Megatron's ``IndexedDataset`` the same way;
    MosaicML and LitData as in (a)), warm; and stager over each layout cold,
    through the same faulty origin as (b). Every batch of every run is checked
    against the flat corpus (wrong samples counted).

The peers live in a separate virtual environment made by ``--setup``
(``benchmarks/.venv-peers``: torch 2.14.1 + torchvision, MosaicML streaming
0.13, LitData 0.2.76, NumPy < 2.2, as they require); when a peer cannot be
installed or fails, the run says so and goes on with the others.

Reproduce::

    make bench
    .venv/bin/python benchmarks/iterate.py --setup      # once: the peers' venv (several GB)
    .venv/bin/python benchmarks/iterate.py              # the comparison
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PEERS_VENV = HERE / ".venv-peers"
PEERS_PYTHON = PEERS_VENV / "bin" / "python"
PEER_PACKAGES = ["torch==2.14.1", "torchvision==0.29.1", "mosaicml-streaming==0.13.0", "litdata==0.2.76",
                 "obstore", "numpy<2.2", "xxhash"]
KEYS = ("benchaccess0001", "benchsecret000000000001")
WARMUP = 50  # steps each warm run takes before its timing starts
NAIVE_STEPS = 20  # cold steps of the naive reader: its figure is the first batch, and each step is a second or so


# -- the corpus ------------------------------------------------------------------------------


def write_corpus(directory: Path, shards: int, tokens: int):
    """uint16 .bin shards whose tokens count up (mod 2**16), each from its own start, and their manifest."""
    import numpy as np

    from stager.write import write_token_shards

    # Distinct starts: shards of a multiple of 2**16 tokens counting on from each other would be
    # byte-identical, and a content-addressed cache would rightly stage one blob for all of them.
    arrays = (((np.arange(tokens, dtype=np.int64) + i * 7919) % 65536).astype(np.uint16) for i in range(shards))
    # 2 MiB blocks: a block a consumer waits for jumps the queue sooner than an 8 MiB one would.
    return write_token_shards(directory, arrays, fmt="bin", block_size=2 << 20)


def check_rows(batch, starts=None) -> int:
    """How many rows of a batch are not one of the flat truth's windows: a run of consecutive tokens
    (mod 2**16) and, given ``starts`` (the first tokens' residues mod seq_len a window of some shard
    can have), one that begins where a window of a shard begins."""
    import numpy as np

    rows = np.asarray(batch).astype(np.int64)
    if rows.ndim == 1:
        rows = rows[None]
    bad = ((np.diff(rows, axis=1) % 65536) != 1).any(axis=1)
    if starts is not None:
        bad |= ~np.isin(rows[:, 0] % rows.shape[1], starts)
    return int(bad.sum())


def window_starts(shards: int, seq_len: int) -> list[int] | None:
    """The residues mod ``seq_len`` of the first token of every window of the corpus (shard i counts up
    from i * 7919, a window starts every seq_len tokens); None where seq_len does not divide 2**16."""
    return sorted({i * 7919 % seq_len for i in range(shards)}) if 65536 % seq_len == 0 else None


# -- contenders (each runs in its own process: --contender NAME --phase warm|cold --spec JSON) -----


def stager_loader(spec: dict, mode: str):
    """``direct``: the TokenDataset iterated as is (batches; it has ``stats()``);
    ``per-sample``: DataLoader(batch_size=B);
    ``workers``: DataLoader(batch_size=None, num_workers=spec["workers"]) over batches."""
    import torch
    from torch.utils.data import DataLoader

    from stager.config import FetchConfig, RetryConfig
    from stager.torch import TokenDataset

    fetch = FetchConfig(concurrency=16, durable=False,
                        retry=RetryConfig(attempts=20, backoff_base=0.05, backoff_max=1.0, deadline=300))
    options = spec.get("storage_options") or {}
    ds = TokenDataset(spec["source"], storage_options=options, seq_len=spec["seq_len"], seed=0,
                      batch_size=spec["batch"], batches=mode != "per-sample", cache_dir=spec["cache"],
                      capacity=spec["capacity"], fetch=fetch, dtype=torch.int64, log_every=0, shuffle_window=4)
    if spec.get("resume_state"):
        ds.load_state_dict(spec["resume_state"])
    if mode == "direct":
        return ds
    if mode == "per-sample":
        return DataLoader(ds, batch_size=spec["batch"])
    return DataLoader(ds, batch_size=None, num_workers=spec["workers"])


def memmap_loader(spec: dict):
    """The limit: stager's own sample order, copied out of memory-mapped shard files into batches."""
    import numpy as np
    import torch

    from stager.iterator import EpochOrder, OrderSpec, SampleIndex, SampleSpec
    from stager.manifest import read_manifest_file

    root = Path(spec["corpus"])
    manifest = read_manifest_file(str(root / ".stager" / "manifest.parquet"))
    maps = [np.memmap(root / p, dtype="<u2", mode="r").view(np.ndarray) for p in manifest.paths]
    n, b = spec["seq_len"], spec["batch"]
    order = EpochOrder(SampleIndex(manifest, SampleSpec(n)), OrderSpec(seed=0, shuffle_window=4), 0)
    found = order.lookup(np.arange(len(order)))
    shards, offsets = found.shards.tolist(), found.offsets.tolist()

    def batches():
        for i in range(0, len(shards), b):
            out = np.empty((min(b, len(shards) - i), n), dtype=np.int64)
            for r, (s, o) in enumerate(zip(shards[i:i + b], offsets[i:i + b])):
                out[r] = maps[s][o:o + n]
            yield torch.from_numpy(out)

    return batches()


def naive_loader(spec: dict):
    """A naive s3fs reader: stager's sample order, each sample one ranged GET of its bytes (``cat_file``),
    nothing staged or read ahead; a failed read is tried again, up to five times."""
    import numpy as np
    import s3fs
    import torch

    from stager.iterator import EpochOrder, OrderSpec, SampleIndex, SampleSpec
    from stager.manifest import read_manifest_file

    manifest = read_manifest_file(str(Path(spec["corpus"]) / ".stager" / "manifest.parquet"))
    fs = s3fs.S3FileSystem(**spec["storage_options"])
    bucket = spec["source"].removeprefix("s3://")
    n, b = spec["seq_len"], spec["batch"]
    order = EpochOrder(SampleIndex(manifest, SampleSpec(n)), OrderSpec(seed=0, shuffle_window=4), 0)
    paths = [f"{bucket}/{p}" for p in manifest.paths]

    def read(shard: int, offset: int) -> np.ndarray:
        for attempt in range(5):
            try:
                data = fs.cat_file(paths[shard], start=2 * offset, end=2 * (offset + n))
                return np.frombuffer(data, dtype="<u2")
            except Exception:  # noqa: BLE001 - the naive reader's whole retry policy
                if attempt == 4:
                    raise
        raise AssertionError("unreachable")

    def batches():
        for lo in range(spec.get("resume_batches", 0) * b, len(order), b):
            found = order.lookup(np.arange(lo, min(lo + b, len(order))))
            rows = [read(s, o) for s, o in zip(found.shards.tolist(), found.offsets.tolist())]
            yield torch.from_numpy(np.stack(rows).astype(np.int64))

    return batches()


def mosaic_loader(spec: dict):
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    remote = spec.get("mosaic_remote")  # a folder or s3:// (zstd shards: decompressed into the local one)
    ds = StreamingDataset(remote=remote, local=spec["mosaic_local"], shuffle=True, shuffle_seed=0,
                          batch_size=spec["batch"], predownload=spec["batch"] * 64)
    loader = DataLoader(ds, batch_size=spec["batch"], num_workers=spec.get("workers", 0))
    return (batch["tokens"] for batch in loader)


def litdata_loader(spec: dict):
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    source = spec.get("lit_remote") or spec["lit_local"]
    kwargs = {}
    if spec.get("lit_remote"):
        kwargs.update(storage_options=spec["lit_storage_options"], cache_dir=spec["lit_local"])
        from litdata.streaming import downloader

        # LitData fetches chunks with obstore, whose client refuses http:// endpoints unless told
        # (its allow_http client option; LitData 0.2.76 has no setting for it): the origin here is http.
        downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}
    ds = StreamingDataset(source, item_loader=TokensLoader(block_size=spec["seq_len"]), shuffle=True, seed=0,
                          max_cache_size="50GB", **kwargs)
    return iter(StreamingDataLoader(ds, batch_size=spec["batch"], num_workers=spec.get("workers", 0)))


def litdata_tokens(path: str):
    """LitData's optimize() input: one shard's tokens (module level, so its worker can unpickle it)."""
    import numpy as np
    import torch

    yield torch.from_numpy(np.fromfile(path, dtype="<u2").view(np.int16).copy()).view(torch.uint16)


def hf_native_loader(spec: dict):
    """Hugging Face's way: the saved folder, torch format, a shuffling DataLoader of batch B."""
    import datasets
    import torch
    from torch.utils.data import DataLoader

    ds = datasets.load_from_disk(spec["hf_local"]).with_format("torch")
    loader = DataLoader(ds, batch_size=spec["batch"], shuffle=True, generator=torch.Generator().manual_seed(0))
    return (batch["input_ids"] for batch in loader)


def parquet_native_loader(spec: dict):
    """Hugging Face's way with Hub-style Parquet files: load_dataset("parquet") (its Arrow cache made on
    the first load, then memory-mapped), torch format, a shuffling DataLoader of batch B."""
    import datasets
    import torch
    from torch.utils.data import DataLoader

    datasets.disable_progress_bars()
    files = sorted(str(p) for p in Path(spec["parquet_local"]).glob("*.parquet"))
    ds = datasets.load_dataset("parquet", data_files=files, split="train",
                               cache_dir=spec["parquet_cache"]).with_format("torch")
    loader = DataLoader(ds, batch_size=spec["batch"], shuffle=True, generator=torch.Generator().manual_seed(0))
    return (batch["input_ids"] for batch in loader)


def megatron_native_loader(spec: dict):
    """Megatron's IndexedDataset per .bin/.idx pair, sequences drawn shuffled by a DataLoader of batch B."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from torch.utils.data import ConcatDataset, DataLoader, Dataset

    class Sequences(Dataset):
        def __init__(self, prefix: str) -> None:
            self.indexed = IndexedDataset(prefix)

        def __len__(self) -> int:
            return len(self.indexed)

        def __getitem__(self, i: int):
            return torch.from_numpy(self.indexed[i].astype("int64"))

    prefixes = sorted(str(p.with_suffix("")) for p in Path(spec["megatron_local"]).glob("*.idx"))
    loader = DataLoader(ConcatDataset([Sequences(p) for p in prefixes]), batch_size=spec["batch"], shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    return iter(loader)


#: Layouts stager reads in place (c): folder under the origin's root, the native contender over it.
LAYOUTS = {"hf": ("hf", "hf native"), "parquet": ("parquet", "parquet native"),
           "megatron": ("megatron", "megatron native"), "mds": ("mds", "mosaic"),
           "mds-zstd": ("mdsz", "mosaic zstd"), "litdata": ("lit", "litdata")}
#: The layouts only the peers' writers make (in the peers' venv), by the kind --write takes.
PEER_LAYOUTS = {"mds": "mosaic", "mds-zstd": "mosaic-zstd", "litdata": "litdata"}


LOADERS = {
    "memmap": memmap_loader,
    "naive": naive_loader,
    "stager": lambda spec: stager_loader(spec, "direct"),
    "stager per-sample": lambda spec: stager_loader(spec, "per-sample"),
    "stager workers": lambda spec: stager_loader(spec, "workers"),
    "mosaic": mosaic_loader,
    "mosaic zstd": mosaic_loader,
    "litdata": litdata_loader,
    "hf native": hf_native_loader,
    "parquet native": parquet_native_loader,
    "megatron native": megatron_native_loader,
    **{f"stager {layout}": (lambda spec: stager_loader(spec, "direct")) for layout in LAYOUTS},
}


def run_warm(name: str, spec: dict) -> dict:
    loader = iter(LOADERS[name](spec))
    for _ in range(spec["warmup"]):
        next(loader)
    began, samples, wrong, checking = time.perf_counter(), 0, 0, 0.0
    for _ in range(spec["steps"]):
        try:
            batch = next(loader)
        except StopIteration:  # a loader whose epoch holds fewer batches goes on with a new one
            loader = iter(LOADERS[name](spec))
            batch = next(loader)
        samples += len(batch)
        t = time.perf_counter()
        wrong += check_rows(batch, spec.get("starts"))  # every batch, against the flat truth
        checking += time.perf_counter() - t
    seconds = time.perf_counter() - began - checking  # the checks are the benchmark's, not the loader's
    return {"sequences_per_s": samples / seconds, "seconds": seconds, "wrong": wrong}


def resume_state(spec: dict) -> dict:
    """stager's state after ``spec["resume_batches"]`` batches, read from the local corpus (same manifest,
    same order) into a cache of its own: where a job restarted from a checkpoint resumes."""
    from stager.torch import TokenDataset

    ds = TokenDataset(spec["corpus"], seq_len=spec["seq_len"], seed=0, batch_size=spec["batch"], batches=True,
                      cache_dir=spec["cache"] + "-resume", capacity=spec["capacity"], log_every=0, shuffle_window=4)
    stream = iter(ds)
    for _ in range(spec["resume_batches"]):
        next(stream)
    return ds.state_dict()


def run_cold(name: str, spec: dict) -> dict:
    began = time.perf_counter()
    loader = LOADERS[name](spec)
    stats = getattr(loader, "stats", None)  # stager in-process: its own account of waiting for data
    loader = iter(loader)
    waits, wrong, first, data_wait = [], 0, None, 0.0
    step_time = spec["step_time"]
    for _ in range(spec["steps"]):
        t = time.perf_counter()
        batch = next(loader)
        now = time.perf_counter()
        if first is None:
            first = now - began
            data_wait = -stats()["wait_seconds"] if stats else 0.0
        else:
            waits.append(now - t)
        wrong += check_rows(batch, spec.get("starts"))
        time.sleep(step_time)  # the model's compute
    elapsed = time.perf_counter() - began - first
    waits.sort()
    blocked = sum(waits)
    result = {"first_batch_s": first, "blocked_s": blocked, "stall_fraction": blocked / elapsed if elapsed else 0.0,
              "p99_wait_ms": 1000 * waits[int(0.99 * (len(waits) - 1))] if waits else 0.0, "wrong": wrong,
              "seconds": elapsed + first}
    if stats:
        result["data_wait_s"] = data_wait + stats()["wait_seconds"]  # blocked on shards not staged yet
    return result


def contender_main(name: str, phase: str, spec: dict) -> None:
    import torch  # noqa: F401 - imports take seconds on a busy machine: not part of any measurement

    {"mosaic": lambda: __import__("streaming"), "mosaic zstd": lambda: __import__("streaming"),
     "litdata": lambda: __import__("litdata"), "hf native": lambda: __import__("datasets"),
     "parquet native": lambda: __import__("datasets"),
     "megatron native": lambda: __import__("megatron.core.datasets.indexed_dataset")}.get(
        name, lambda: __import__("stager.torch"))()
    if phase == "cold" and spec.get("resume_batches") and name.startswith("stager"):
        spec = dict(spec, resume_state=resume_state(spec))  # before the clock starts
    result = (run_warm if phase == "warm" else run_cold)(name, spec)
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)  # peers leave worker threads behind; the result is out


# -- peer formats (run in the peers' venv: --write mosaic|litdata SRC OUT) ------------------------


def write_peer(kind: str, src: Path, out: Path, seq_len: int) -> None:
    import numpy as np

    shards = sorted(p for p in src.iterdir() if p.suffix == ".bin")
    if kind in ("mosaic", "mosaic-zstd"):
        from streaming import MDSWriter

        with MDSWriter(out=str(out), columns={"tokens": f"ndarray:uint16:{seq_len}"},
                       compression="zstd" if kind == "mosaic-zstd" else None, size_limit=1 << 26) as writer:
            for path in shards:
                tokens = np.fromfile(path, dtype="<u2")
                for j in range(len(tokens) // seq_len):
                    writer.write({"tokens": tokens[j * seq_len:(j + 1) * seq_len]})
    elif kind == "litdata":
        from litdata import optimize
        from litdata.streaming.item_loader import TokensLoader

        optimize(fn=litdata_tokens, inputs=[str(p) for p in shards], output_dir=str(out), chunk_bytes="64MB",
                 item_loader=TokensLoader(), num_workers=1, mode="overwrite")
    else:
        raise SystemExit(f"unknown peer format {kind}")


def write_layout(kind: str, src: Path, out: Path, seq_len: int) -> None:
    """The corpus as a Hugging Face folder or Megatron pairs, by their own writers, one window a sample."""
    import numpy as np

    shards = sorted(p for p in src.iterdir() if p.suffix == ".bin")
    if kind == "hf":
        import datasets

        datasets.disable_progress_bars()
        rows = np.concatenate([(t := np.fromfile(p, dtype="<u2"))[:len(t) // seq_len * seq_len].reshape(-1, seq_len)
                               for p in shards])
        features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("uint16"), length=seq_len)})
        datasets.Dataset.from_dict({"input_ids": rows}, features=features).save_to_disk(str(out),
                                                                                         num_shards=len(shards))
    elif kind == "parquet":
        import datasets

        # As the Hub's Parquet files of a tokenized dataset hold it: an `input_ids` list<int32> column
        # (what a tokenizer's output becomes), one file per shard, datasets' own writer and row groups.
        datasets.disable_progress_bars()
        features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
        out.mkdir(parents=True, exist_ok=True)
        for i, path in enumerate(shards):
            tokens = np.fromfile(path, dtype="<u2")
            rows = tokens[:len(tokens) // seq_len * seq_len].reshape(-1, seq_len).astype(np.int32)
            datasets.Dataset.from_dict({"input_ids": rows}, features=features).to_parquet(
                str(out / f"train-{i:05d}-of-{len(shards):05d}.parquet"))
    elif kind == "megatron":
        import warnings

        import torch
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
        out.mkdir(parents=True, exist_ok=True)
        for path in shards:
            tokens = np.fromfile(path, dtype="<u2")
            builder = IndexedDatasetBuilder(str(out / f"{path.stem}_text_document.bin"), dtype=np.uint16)
            for j in range(len(tokens) // seq_len):
                builder.add_document(torch.from_numpy(tokens[j * seq_len:(j + 1) * seq_len].astype(np.int64)),
                                     [seq_len])
            builder.finalize(str(out / f"{path.stem}_text_document.idx"))
    else:
        raise SystemExit(f"unknown layout {kind}")


def prepare_layouts(root: Path, corpus: Path, seq_len: int, peers: dict,
                    wanted=lambda name: True) -> dict[str, str | None]:
    """Write (if missing) and index each layout under ``root`` that ``wanted`` keeps (its ``stager LAYOUT``
    contender or its native loader); None for a usable one, else why not."""
    status: dict[str, str | None] = {}
    for layout, (folder, native) in LAYOUTS.items():
        where = root / folder
        if not (wanted(f"stager {layout}") or wanted(native)):
            status[layout] = "left out by --only"
            continue
        if layout in PEER_LAYOUTS:
            if peers.get(native.split()[0]):
                status[layout] = f"its writer is the peer's ({peers[native.split()[0]]})"
                continue
            if not (where / "index.json").exists():
                status[layout] = "the peer's writer did not write it"
                continue
        elif not where.exists():
            done = subprocess.run([sys.executable, __file__, "--write-layout", layout, str(corpus), str(where),
                                   "--seq-len", str(seq_len)], capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
            if done.returncode:
                status[layout] = "writing it failed: " + (done.stderr.strip().splitlines() or ["?"])[-1][:200]
                continue
        if not (where / ".stager" / "manifest.parquet").exists():
            done = subprocess.run([sys.executable, "-m", "stager", "index", str(where)], capture_output=True,
                                  text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
            if done.returncode:
                status[layout] = "stager index failed: " + (done.stderr.strip().splitlines() or ["?"])[-1][:200]
                continue
        status[layout] = None
    return status


# -- the orchestration ---------------------------------------------------------------------------


def setup() -> None:
    """Make the peers' venv (the benchmark's own setup step)."""
    if not PEERS_PYTHON.exists():
        base = getattr(sys, "_base_executable", sys.executable)  # the interpreter behind this venv
        subprocess.run([base, "-m", "venv", str(PEERS_VENV)], check=True)
    (PEERS_VENV / ".gitignore").write_text("*\n")  # never committed
    subprocess.run([str(PEERS_PYTHON), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)


def peer_status() -> dict[str, str | None]:
    """None for a usable peer, else why it cannot run here."""
    status: dict[str, str | None] = {}
    for name, module in (("mosaic", "streaming"), ("litdata", "litdata")):
        if not PEERS_PYTHON.exists():
            status[name] = f"no peers venv at {PEERS_VENV} (run with --setup)"
            continue
        probe = subprocess.run([str(PEERS_PYTHON), "-c", f"import {module}"], capture_output=True, text=True)
        status[name] = None if probe.returncode == 0 else f"import {module} failed: " + \
            (probe.stderr.strip().splitlines() or ["?"])[-1]
    return status


def run_contender(name: str, phase: str, spec: dict, timeout: float) -> dict:
    python = str(PEERS_PYTHON) if name in ("mosaic", "mosaic zstd", "litdata") else sys.executable
    env = {**os.environ, **spec.get("env", {}), "PYTHONPATH": str(REPO)}
    try:
        proc = subprocess.run([python, __file__, "--contender", name, "--phase", phase, "--spec", json.dumps(spec)],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"exit {proc.returncode}: {tail[:200]}"}


def table(rows: list[list[object]], headers: list[str]) -> str:
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", action="store_true", help="make the peers' venv, then exit")
    parser.add_argument("--mib", type=int, default=256, help="corpus size in MiB")
    parser.add_argument("--shard-mib", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warm-steps", type=int, default=0,
                        help="timed warm steps per run (default: the rest of the epoch after the warm-up)")
    parser.add_argument("--cold-steps", type=int, default=0, help="steps of the cold run (default: the epoch)")
    parser.add_argument("--bandwidth-mb", type=float, default=16.0, help="origin bandwidth cap, MB/s")
    parser.add_argument("--cold-batch", type=int, default=32,
                        help="batch of the cold run (a step long enough that loader CPU is not the stall)")
    parser.add_argument("--consume", type=float, default=0.5, help="training consumption / origin bandwidth")
    parser.add_argument("--resume-at", type=float, default=0.0,
                        help="the cold run (naive and stager) resumes this fraction into the epoch, as a job "
                             "restarted from a checkpoint on a new node (stager from its saved state)")
    parser.add_argument("--rounds", type=int, default=7, help="warm rounds (the median counts)")
    parser.add_argument("--only", default="", help="comma-separated contenders to run")
    parser.add_argument("--workdir", default=None, help="kept afterwards (default: a temporary one, removed)")
    parser.add_argument("--contender"), parser.add_argument("--phase"), parser.add_argument("--spec")
    parser.add_argument("--write", nargs=3, metavar=("KIND", "SRC", "OUT"))
    parser.add_argument("--write-layout", nargs=3, metavar=("KIND", "SRC", "OUT"))
    args = parser.parse_args()
    if args.contender:
        return contender_main(args.contender, args.phase, json.loads(args.spec))
    if args.write:
        return write_peer(args.write[0], Path(args.write[1]), Path(args.write[2]), args.seq_len)
    if args.write_layout:
        return write_layout(args.write_layout[0], Path(args.write_layout[1]), Path(args.write_layout[2]), args.seq_len)
    if args.setup:
        return setup()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="stager-iterate-"))
    try:
        compare(args, work)
    finally:
        if not args.workdir:  # a temporary workdir holds over 1 GB of corpus and caches
            shutil.rmtree(work, ignore_errors=True)


def compare(args: argparse.Namespace, work: Path) -> None:
    sys.path.insert(0, str(REPO))
    from stager.testing import FaultPlan, FaultProxy, S3Server

    only = set(filter(None, args.only.split(",")))
    peers = peer_status()
    root = work / "s3"
    corpus = root / "corpus"
    shard_tokens = args.shard_mib * (1 << 20) // 2
    shards = max(1, args.mib // args.shard_mib)
    print(f"machine: {os.cpu_count()} cores, loopback; corpus: {shards} x {args.shard_mib} MiB uint16 shards, "
          f"seq_len {args.seq_len}, batch {args.batch}; workdir {work}", flush=True)
    if not (corpus / ".stager" / "manifest.parquet").exists():
        write_corpus(corpus, shards, shard_tokens)
    warm_layouts = [f"cache-warm-{layout}" for layout in LAYOUTS]
    # every run starts cold
    for stale in ("cache-warm", "cache-cold", "mosaic-cold", "lit-cold", "mosaic-zstd-local", *warm_layouts):
        shutil.rmtree(work / stale, ignore_errors=True)
    for layout, kind in PEER_LAYOUTS.items():
        folder = LAYOUTS[layout][0]
        if peers[LAYOUTS[layout][1].split()[0]] is None and not (root / folder / "index.json").exists():
            done = subprocess.run([str(PEERS_PYTHON), __file__, "--write", kind, str(corpus), str(root / folder),
                                   "--seq-len", str(args.seq_len)], capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
            if done.returncode:
                why = "writing its format failed: " + (done.stderr.strip().splitlines() or ["?"])[-1][:200]
                if kind in peers:
                    peers[kind] = why
                else:  # the compressed MDS copy: only its layout is lost
                    print(f"NOTE: {layout} cannot run here: {why}", flush=True)
    wanted = lambda name: (not only or name in only) and peers.get(name.split()[0], None) is None  # noqa: E731
    layouts = prepare_layouts(root, corpus, args.seq_len, peers, wanted)
    for kind, why in [*peers.items(), *layouts.items()]:
        if why:
            print(f"NOTE: {kind} cannot run here: {why}", flush=True)

    # (a) warm: every contender once per round, the median round counts (the machine is shared and noisy)
    epoch_steps = shards * shard_tokens // args.seq_len // args.batch
    # A whole epoch per run: a window of a few thousand steps lasts under 0.1 s, and single runs that
    # short swung by 40% here from one process to the next.
    warm_steps = args.warm_steps or epoch_steps - WARMUP
    base = {"seq_len": args.seq_len, "batch": args.batch, "corpus": str(corpus), "capacity": 1 << 40,
            "warmup": WARMUP, "steps": warm_steps, "starts": window_starts(shards, args.seq_len)}
    warm_cache = str(work / "cache-warm")
    run_contender("stager", "warm", dict(base, source=str(corpus), cache=warm_cache, steps=epoch_steps - 60),
                  1800)  # stages the whole corpus into the cache first
    specs = {
        "memmap": base,
        "stager": dict(base, source=str(corpus), cache=warm_cache),
        "stager per-sample": dict(base, source=str(corpus), cache=warm_cache),
        "mosaic": dict(base, mosaic_local=str(root / "mds")),
        "mosaic zstd": dict(base, mosaic_remote=str(root / "mdsz"), mosaic_local=str(work / "mosaic-zstd-local")),
        "litdata": dict(base, lit_local=str(root / "lit")),
        "hf native": dict(base, hf_local=str(root / "hf")),
        "parquet native": dict(base, parquet_local=str(root / "parquet"),
                               parquet_cache=str(work / "parquet-hf-cache")),
        "megatron native": dict(base, megatron_local=str(root / "megatron")),
    }
    for layout, (folder, _native) in LAYOUTS.items():
        specs[f"stager {layout}"] = dict(base, source=str(root / folder), cache=str(work / f"cache-warm-{layout}"))
        if layouts[layout] is None and wanted(f"stager {layout}"):  # staged whole first, as the flat corpus
            run_contender(f"stager {layout}", "warm", dict(specs[f"stager {layout}"], steps=epoch_steps - 60), 1800)
    unusable = {f"stager {layout}" for layout, why in layouts.items() if why}
    unusable |= {native for layout, (_, native) in LAYOUTS.items()
                 if layouts[layout] and native not in ("mosaic", "litdata")}  # those two also run in (a)
    for name in ("mosaic zstd", "parquet native"):  # the copy they decompress / convert to, made before the rounds
        if wanted(name) and name not in unusable:
            run_contender(name, "warm", dict(specs[name], steps=epoch_steps - 60), 1800)
    names = [name for name in specs if wanted(name) and name not in unusable]
    rounds: list[dict[str, dict]] = []
    for r in range(args.rounds):  # each round starts with a different contender: the machine drifts
        order = names[r % len(names):] + names[:r % len(names)]
        rounds.append({name: run_contender(name, "warm", specs[name], 1800) for name in order})
    rows = []
    for name in names:
        results = [one[name] for one in rounds]
        ok = sorted((r for r in results if "error" not in r), key=lambda r: r["sequences_per_s"])
        if not ok:
            rows.append([name, "failed", "", next(r for r in results if "error" in r)["error"]])
            continue
        # vs memmap: the median of the ratios within each round (both ran minutes apart at most)
        ratios = sorted(one[name]["sequences_per_s"] / one["memmap"]["sequences_per_s"] for one in rounds
                        if "error" not in one[name] and "error" not in one.get("memmap", {"error": 1}))
        ratio = f"{ratios[len(ratios) // 2]:.2f}x" if ratios else ""
        spread = f"{ratios[0]:.2f}-{ratios[-1]:.2f}" if ratios else ""
        median = ok[len(ok) // 2]
        rows.append([name, f"{median['sequences_per_s']:,.0f}", ratio, spread,
                     f"wrong samples: {sum(r['wrong'] for r in ok)}"])
    print(f"\n(a) warm, sequences/s over {warm_steps} steps of {args.batch} (one process, shuffled; median of "
          f"{args.rounds} rounds; vs memmap: the median of the rounds' ratios):")
    print(table(rows, ["contender", "seq/s", "vs memmap", "rounds' ratios", "notes"]), flush=True)

    def ratio(name: str, other: str) -> str:
        values = sorted(one[name]["sequences_per_s"] / one[other]["sequences_per_s"] for one in rounds
                        if "error" not in one.get(name, {"error": 1}) and "error" not in one.get(other, {"error": 1}))
        return f"{values[len(values) // 2]:.2f}x" if values else "n/a"

    rows = []
    for layout, (_folder, native) in LAYOUTS.items():
        name = f"stager {layout}"
        if name not in names:
            rows.append([layout, "not run", "", "", layouts.get(layout) or "left out by --only"])
            continue
        ok = sorted((one[name] for one in rounds if "error" not in one[name]), key=lambda r: r["sequences_per_s"])
        if not ok:
            rows.append([layout, "failed", "", "", rounds[0][name]["error"]])
            continue
        native_wrong = sum(one[native].get("wrong", 0) for one in rounds if native in one and "error" not in one[native])
        rows.append([layout, f"{ok[len(ok) // 2]['sequences_per_s']:,.0f}", ratio(name, "stager"),
                     ratio(name, native) if native in names else f"n/a ({native} not run)",
                     f"wrong samples: stager {sum(r['wrong'] for r in ok)}, native {native_wrong}"])
    print(f"\n(c) layouts read in place, warm (same rounds; target: >= 0.9x stager's flat figure and ahead of "
          f"the native loader):")
    print(table(rows, ["layout", "stager seq/s", "vs stager flat", "vs native", "notes"]), flush=True)

    # (b) cold, through a slow and faulty origin; each loader makes batches in one worker process,
    # beside the training loop, as in training
    bandwidth = args.bandwidth_mb * 1e6
    step_bytes = args.cold_batch * args.seq_len * 2
    step_time = step_bytes / (bandwidth * args.consume)
    plan = FaultPlan(latency_s=0.01, jitter_s=0.02, spike_p=0.02, spike_s=1.0, slowdown_p=0.02, error500_p=0.01,
                     reset_p=0.01, flip_p=0.005, bandwidth_bps=bandwidth)
    cold = {}
    with S3Server(root, access_key=KEYS[0], secret_key=KEYS[1], etag_hash="") as server:
        with FaultProxy(server.endpoint_url, plan, seed=1, credentials=server.credentials) as proxy:
            env = server.env(proxy.url)
            layout_runs = [f"stager {layout}" for layout in LAYOUTS if layouts[layout] is None]
            for name in ("naive", "stager", "stager workers", "mosaic", "litdata", *layout_runs):
                if not wanted(name):
                    continue
                steps = args.cold_steps or shards * shard_tokens // args.seq_len // args.cold_batch - 4
                spec = dict(base, batch=args.cold_batch, steps=steps, step_time=step_time, env=env,
                            capacity=1 << 40, workers=1)
                if args.resume_at and name in ("naive", "stager"):
                    epoch_batches = shards * shard_tokens // args.seq_len // args.cold_batch
                    spec.update(resume_batches=int(args.resume_at * epoch_batches),
                                steps=min(steps, epoch_batches - int(args.resume_at * epoch_batches) - 4))
                if name == "naive":
                    steps = min(steps, NAIVE_STEPS)
                    spec.update(steps=steps, source="s3://corpus",
                                storage_options=server.storage_options(proxy.url))
                elif name.startswith("stager"):
                    shutil.rmtree(work / "cache-cold", ignore_errors=True)  # each stager run starts cold
                    bucket = LAYOUTS[name.split()[1]][0] if name in layout_runs else "corpus"
                    spec.update(source=f"s3://{bucket}", cache=str(work / "cache-cold"),
                                storage_options=server.storage_options(proxy.url))
                elif name == "mosaic":
                    spec.update(mosaic_remote="s3://mds", mosaic_local=str(work / "mosaic-cold"),
                                env={**env, "S3_ENDPOINT_URL": proxy.url})
                else:
                    spec.update(lit_remote="s3://lit", lit_local=str(work / "lit-cold"),
                                lit_storage_options={"endpoint_url": proxy.url, "aws_access_key_id": KEYS[0],
                                                     "aws_secret_access_key": KEYS[1], "region_name": "us-east-1"},
                                env={**env, "AWS_ALLOW_HTTP": "true"})
                fetched = proxy.bytes_forwarded
                cold[name] = run_contender(name, "cold", spec, 1800)
                # the origin's bytes per byte the loop consumed (counted at the proxy, the whole run)
                cold[name]["fetched_per_consumed"] = (proxy.bytes_forwarded - fetched) / (steps * step_bytes)
            faults = proxy.faults
    rows = []
    for name, r in cold.items():
        if "error" in r:
            rows.append([name, "failed", "", "", "", "", "", r["error"]])
        else:
            data = f"{r['data_wait_s']:.2f}" if "data_wait_s" in r else "n/a"
            rows.append([name, f"{r['first_batch_s']:.2f}", f"{r['blocked_s']:.2f}",
                         f"{100 * r['stall_fraction']:.2f}%", f"{r['p99_wait_ms']:.1f}", data,
                         f"{r['fetched_per_consumed']:.2f}", str(r["wrong"])])
    print(f"\n(b) cold start through the fault proxy (bandwidth {args.bandwidth_mb:g} MB/s; the loop consumes "
          f"{args.consume:g}x of it: {1000 * step_time:.2f} ms of compute per step of {args.cold_batch} sequences; "
          "stager in the loop's process, then each loader with one worker process); "
          f"faults injected: {faults}")
    print(table(rows, ["contender", "first batch s", "blocked s", "stall after 1st", "p99 wait ms",
                       "of it on data s", "fetched / consumed", "wrong samples"]))
    print(f"\nreproduce: {sys.executable} {__file__} " + " ".join(a for a in sys.argv[1:] if a != "--setup"))


if __name__ == "__main__":
    main()
