"""Bringing the index and the disk back in line, at start-up and when a blob is resumed.

Stat only, never a rehash, so it runs in time proportional to the number of
files. Every decision about one digest is taken inside a write transaction of
the index. A live process's transitions record themselves in one too, after
the file system work they do beforehand (a begin's new partial file, a
commit's rename), and the rules below read those in-between states the way
that process goes on from them: a new partial file it has not recorded yet is
removed (its begin sees that and makes it again), a renamed file whose row is
still partial is promoted (its commit finds it complete). The rules:

- partial row, partial file of its generation with the right size: kept;
  its verified blocks are forgotten if some were recorded without fdatasync
  during another boot (they may not have reached the disk);
- partial row without that file, but a complete file of the right size: the
  process crashed between commit's rename and its index update: promoted;
- partial row otherwise: dropped (the partial file, if any, removed);
- complete row without its file, or with a file of the wrong size: dropped;
- complete row committed without fsync during another boot (``durable`` off):
  the kernel may not have written all of it back before that boot ended, so
  the file's commit stamp is taken off and every reader hashes it before
  serving it (``reader.py``); a wrong file is dropped and fetched again there.
  Hashing them all here would make a reboot cost a read of the cache;
- a file under ``partial/`` or ``blobs/`` that no row accounts for, or whose
  name is not a blob's (a temporary or stray file): removed;
- the capacity total is recomputed from the rows; lock files nobody holds and
  holds of dead processes are removed.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from .blob_index import BlobIndex, BlobRow
from .layout import SHARD_DIRS, CacheLayout, remove_stray_format_temps
from .reader import clear_stamp
from .records import BlobState


@dataclass(slots=True)
class ReconcileReport:
    """What a reconciliation changed."""

    files_removed: int = 0  # orphans, strays, temporaries, wrong-size files
    rows_dropped: int = 0  # rows whose file was missing or wrong
    promoted: int = 0  # partial rows whose blob had been renamed into place
    blocks_forgotten: int = 0  # partial blobs whose unsynced blocks were forgotten after a reboot
    unsynced_rechecked: int = 0  # complete blobs committed without fsync before a reboot: hashed by readers
    lock_files_removed: int = 0
    dead_owners: int = 0


def _stat(path: Path) -> os.stat_result | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        return False


def disk_charge(st: os.stat_result, reserved: int) -> int:
    """What a complete file costs against the capacity: the disk blocks it really uses, but no more
    than ``reserved`` (what its begin reserved, or what it is charged already).

    A file system may count blocks of its own books in a file: ext4 an extent-tree block for a file
    written out of order and synced in parts, until the writeback merges its extents. No begin made
    room for those, so charging them put a full cache over its capacity.
    """
    return min(st.st_blocks * 512, reserved)


def repair_partial(index: BlobIndex, layout: CacheLayout, row: BlobRow, this_boot: str,
                   report: ReconcileReport | None = None) -> BlobRow | None:
    """Bring one partial row in line with the disk; call inside ``index.write()``.

    Returns the row as it now is (partial, or complete if promoted), or None if it was dropped.
    """
    report = report if report is not None else ReconcileReport()
    partial_path = layout.partial_path(row.digest, row.gen)
    pst = _stat(partial_path)
    if pst is not None and pst.st_size == row.size:
        if row.volatile_boot is not None and row.volatile_boot != this_boot:
            index.forget_blocks(row.digest)
            report.blocks_forgotten += 1
        return index.get(row.digest)
    if pst is not None:
        report.files_removed += _unlink(partial_path)
    complete_path = layout.complete_path(row.digest)
    cst = _stat(complete_path)
    if cst is not None and cst.st_size == row.size:
        # Only commit puts a file there, after every block was verified (and fsynced, if durable).
        _promote(index, row.digest, str(complete_path), cst, row.charged, row.last_access, row.volatile_boot,
                 this_boot)
        report.promoted += 1
        return index.get(row.digest)
    index.delete_blob(row.digest)
    report.rows_dropped += 1
    return None


def _promote(index: BlobIndex, digest: str, path: str, st: os.stat_result, reserved: int, last_access: float,
             volatile_boot: str | None, this_boot: str) -> None:
    """Record a blob renamed into place as complete (see :func:`_settle_other_boot`)."""
    index.mark_complete(digest, disk_charge(st, reserved), last_access, volatile_boot)
    if volatile_boot is not None and volatile_boot != this_boot:
        _settle_other_boot(index, digest, path)


def _settle_other_boot(index: BlobIndex, digest: str, path: str) -> bool:
    """A complete blob committed without fsync during another boot: readers hash it from now on (the
    row keeps its flag where the stamp could not be taken off, for a process that can to do it)."""
    if not clear_stamp(path):
        return False
    index.settle(digest)
    return True


def reconcile_partials(index: BlobIndex, layout: CacheLayout, this_boot: str, report: ReconcileReport) -> None:
    """Partial rows and the ``partial/`` directory, in one transaction (there are few)."""
    with index.write():
        keep: set[str] = set()
        for row in index.rows_in_state(BlobState.PARTIAL):
            now = repair_partial(index, layout, row, this_boot, report)
            if now is not None and now.state is BlobState.PARTIAL:
                keep.add(f"{now.digest}.{now.gen}")
        for name in os.listdir(layout.partial_dir):
            if name not in keep:
                report.files_removed += _unlink(layout.partial_dir / name)


def reconcile_complete(index: BlobIndex, layout: CacheLayout, this_boot: str, report: ReconcileReport) -> None:
    """``blobs/xx/`` against the rows, one transaction per first hex digit (16 shard directories)."""
    blobs_dir = str(layout.blobs_dir)
    complete = int(BlobState.COMPLETE)
    for first in "0123456789abcdef":
        with index.write():
            rows = index.sizes_with_prefix(first)
            present: set[str] = set()
            for prefix in SHARD_DIRS[int(first, 16) * 16:(int(first, 16) + 1) * 16]:
                _reconcile_shard(index, layout, os.path.join(blobs_dir, prefix), prefix, rows, present, this_boot,
                                 report)
            for digest, (state, *_) in rows.items():
                if state == complete and digest not in present:
                    index.delete_blob(digest)
                    report.rows_dropped += 1


def _reconcile_shard(index: BlobIndex, layout: CacheLayout, shard: str, prefix: str,
                     rows: dict[str, tuple[int, int, int, str, float, str | None]], present: set[str],
                     this_boot: str, report: ReconcileReport) -> None:
    try:
        entries = list(os.scandir(shard))
    except FileNotFoundError:  # made by the first commit that needs it
        return
    for entry in entries:
        name = entry.name
        row = rows.get(name)
        if row is None or not name.startswith(prefix) or not entry.is_file(follow_symlinks=False):
            report.files_removed += _unlink(Path(entry.path))
            continue
        state, size, charged, gen, last_access, volatile_boot = row
        st = entry.stat(follow_symlinks=False)
        if st.st_size != size:
            report.files_removed += _unlink(Path(entry.path))
            continue
        present.add(name)
        if state == BlobState.PARTIAL:
            # Renamed into place, then the process died before the index said so.
            report.files_removed += _unlink(layout.partial_path(name, gen))
            _promote(index, name, entry.path, st, charged, last_access, volatile_boot, this_boot)
            report.promoted += 1
            continue
        if (charge := disk_charge(st, charged)) != charged:
            index.set_charged(name, charge)
        if volatile_boot is not None and volatile_boot != this_boot and _settle_other_boot(index, name, entry.path):
            report.unsynced_rechecked += 1


def reconcile(index: BlobIndex, layout: CacheLayout, this_boot: str) -> ReconcileReport:
    """The full start-up pass over the index and the disk (stat only)."""
    report = ReconcileReport()
    remove_stray_format_temps(layout)
    reconcile_partials(index, layout, this_boot, report)
    reconcile_complete(index, layout, this_boot, report)
    index.drop_orphan_block_records()
    index.recompute_used()
    return report
