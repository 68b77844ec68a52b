"""Can this machine's FUSE pass reads through to a backing file (FUSE_PASSTHROUGH, Linux 6.9+)?

The mount cannot use passthrough from its stack (pyfuse3 3.5 on libfuse 3.14):
libfuse 3.14 speaks FUSE protocol 7.38, its ``fuse_conn_info.want`` is 32 bits
(the passthrough flag is bit 37 of the INIT flags), it has no
``fuse_passthrough_open`` and its ``fuse_reply_open`` cannot carry a backing
id; pyfuse3's ``FileInfo`` has only fh, direct_io, keep_cache and nonseekable.
This probe asks the kernel directly, without libfuse: it mounts a FUSE file
system on a raw ``/dev/fuse`` descriptor, reads the kernel's INIT request,
answers it asking for passthrough, then registers a backing file with
``FUSE_DEV_IOC_BACKING_OPEN`` (which needs CAP_SYS_ADMIN). If both work, the
kernel side is there and only the userspace library is missing.

Run (as root): ``.venv/bin/python benchmarks/fuse_passthrough_probe.py``
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
import sys
import tempfile

PASSTHROUGH = 1 << 37  # FUSE_PASSTHROUGH in the 64-bit INIT flags (protocol 7.40)
INIT_EXT, ASYNC_READ, MAX_PAGES = 1 << 30, 1 << 0, 1 << 22
BACKING_OPEN = 0x4010E501  # _IOW(229, 1, struct fuse_backing_map)
BACKING_CLOSE = 0x4004E502  # _IOW(229, 2, uint32_t)


def main() -> int:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    target = tempfile.mkdtemp(prefix="fuse-probe-")
    fd = os.open("/dev/fuse", os.O_RDWR)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
    if libc.mount(b"probe", target.encode(), b"fuse.probe", 1, options) != 0:  # MS_RDONLY
        print(f"mount: {os.strerror(ctypes.get_errno())}")
        return 1
    try:
        request = os.read(fd, 1 << 20)
        _, _, unique = struct.unpack_from("<IIQ", request, 0)
        major, minor, max_readahead, flags, flags2 = struct.unpack_from("<IIIII", request, 40)
        offered = flags | (flags2 << 32)
        print(f"kernel FUSE protocol {major}.{minor}; INIT offers FUSE_PASSTHROUGH: {bool(offered & PASSTHROUGH)}")
        reply = (ASYNC_READ | MAX_PAGES | INIT_EXT | PASSTHROUGH) & offered
        body = struct.pack("<IIIIHHIIHHII", 7, min(minor, 40), max_readahead, reply & 0xFFFFFFFF, 12, 9, 1 << 20,
                           1, 256, 0, reply >> 32, 1) + bytes(24)  # flags2, max_stack_depth 1, unused
        os.write(fd, struct.pack("<IiQ", 16 + len(body), 0, unique) + body)
        backing = os.open(sys.executable, os.O_RDONLY)
        try:
            backing_id = fcntl.ioctl(fd, BACKING_OPEN, bytearray(struct.pack("<iIQ", backing, 0, 0)))
            print(f"FUSE_DEV_IOC_BACKING_OPEN: backing id {backing_id}: the kernel side works here")
            fcntl.ioctl(fd, BACKING_CLOSE, struct.pack("<I", backing_id))
        except OSError as exc:
            print(f"FUSE_DEV_IOC_BACKING_OPEN: {errno.errorcode.get(exc.errno, exc.errno)} ({exc.strerror})")
        finally:
            os.close(backing)
    finally:
        libc.umount2(target.encode(), 2)  # MNT_DETACH
        os.close(fd)
        os.rmdir(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
