"""``python -m stager.fuse REPORT_FD [LOG_LEVEL]``: the process of a background mount (see
:func:`stager.fuse.mount.mount_in_background`)."""

import sys

from .mount import background_main

sys.exit(background_main(int(sys.argv[1]), *(int(level) for level in sys.argv[2:3])))
