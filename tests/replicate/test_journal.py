"""The journal: what is done survives SIGKILL at any moment, uploads and parts included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from stager.replicate.journal import Journal

WRITER = textwrap.dedent("""
    import asyncio, sys
    from stager.replicate.journal import Journal

    async def main():
        journal = Journal(sys.argv[1])
        await journal.begin_upload("big.bin", b"d" * 16, 5 << 20, "token-1")
        for n in range(1, 1_000_000):
            await journal.record_done(f"obj-{n:07d}", b"x" * 16, n)
            await journal.record_part("big.bin", n, 5 << 20)
            if n == 50:
                print("ready", flush=True)

    asyncio.run(main())
""")


async def test_records_survive_sigkill(tmp_path):
    path = tmp_path / "journal.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=10)
    async with Journal(path) as journal:
        done = await journal.done_count()
        assert done >= 50
        upload = await journal.upload_of("big.bin")
        assert upload is not None and upload.token == "token-1" and upload.part_size == 5 << 20
        # Records are committed in order: every part up to the last done object is there.
        assert set(range(1, done)) <= set(upload.parts)
        await journal.record_done("big.bin", b"d" * 16, 123)
        assert await journal.upload_of("big.bin") is None  # done forgets the upload and its parts
        await journal.forget("obj-0000001")
        assert await journal.done_count() == done  # one removed, big.bin added
    assert os.path.exists(path)
