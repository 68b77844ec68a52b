"""The FUSE front end: a read-only view of a dataset, in its own layout, backed by the verified cache.

``stager mount SOURCE MOUNTPOINT`` shows the dataset's files as the manifest
lists them, so code that reads files by path works unchanged (``cp -r``,
``tar``, ``rsync``, ``numpy.memmap``, ``torch.load``...). How it works:

- :mod:`.tree`: the inode table, built once from the manifest (directories,
  sizes, mtimes, walk order); ``ls``, ``stat`` and ``find`` never touch the origin.
- :mod:`.reader`: serves byte ranges from the cache with ``pread`` (the
  complete file, or verified blocks of a partial one); a block not there yet
  is fetched alone, urgently, through the session and served once verified.
- :mod:`.readahead`: sequential reads (within a file, or file after file in
  walk order) start a plan that stages the following blocks and files.
- :mod:`.operations`: the pyfuse3 handlers; read-only (EROFS), and the only
  place where stager errors become errno values.
- :mod:`.mount`: the life cycle: checks, session, pyfuse3 on the engine's
  asyncio loop, readiness, SIGTERM/SIGINT, background mounts, unmount.

The mount reaches the engine only through a :class:`stager.session.Session`
(an engine in its own process today, the node daemon when one runs).
"""

from .mount import MountConfig, MountError, check_fuse, mount_in_background, mount_pid, serve, unmount
from .readahead import ReadAheadConfig
from .tree import Tree

__all__ = ["MountConfig", "MountError", "ReadAheadConfig", "Tree", "check_fuse", "mount_in_background", "mount_pid",
           "serve", "unmount"]
