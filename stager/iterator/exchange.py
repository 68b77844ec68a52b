"""One swap of small payloads among the DataLoader workers of one loader, as they start.

torchdata's ``StatefulDataLoader.load_state_dict`` hands each new worker only
the state the saved loader's worker of the same number had; a worker without a
namesake gets nothing. Re-dealing at another shape needs all of them, so the
workers of one loader meet once and swap what they were given.

They meet at a Unix socket in Linux's abstract namespace, named after what
they share and no other loader has (the dataset object's token, the parent
process, the loader's base seed, the worker count): nothing on disk to clean
up, gone with the socket that bound it, never on the network. The first
member to bind the name collects every member's payload and sends the list
back to each. Every wait is bounded by one deadline: a member that never comes
(a worker that died while starting) fails the others with a clear error,
never a hang. And every wait looks, at least once a second, whether the
process that started the member is still there: workers of a loader whose
process died (a job that crashed, or exited on the error of another worker)
give up at once rather than outlive it by the whole deadline.
"""

from __future__ import annotations

import errno
import json
import os
import select
import socket
import struct
import time
from typing import Any

from ..errors import StagerError

_LENGTH = struct.Struct("!I")
_RETRY = 0.005  # seconds between attempts while the first member binds but does not listen yet
_LOOK = 1.0  # seconds a wait goes at most before it looks whether the loader's process is still there
_ORPHANED = "the loader's process is gone; not waiting for the other workers"
MAX_FRAME = 1 << 24


def _send(sock: socket.socket, value: Any) -> None:
    body = json.dumps(value).encode()
    sock.sendall(_LENGTH.pack(len(body)) + body)


def _wait_readable(sock: socket.socket, deadline: float, parent: int) -> None:
    """Return once ``sock`` can be read (or accepted on); raise TimeoutError past ``deadline``, and
    StagerError once this process's parent is no longer ``parent``."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        readable, _, _ = select.select([sock], [], [], min(left, _LOOK))
        if readable:
            return
        _check_parent(parent)


def _check_parent(parent: int) -> None:
    if os.getppid() != parent:
        raise StagerError(_ORPHANED)


def _receive(sock: socket.socket, deadline: float, parent: int) -> Any:
    head = _exactly(sock, _LENGTH.size, deadline, parent)
    (size,) = _LENGTH.unpack(head)
    if size > MAX_FRAME:
        raise StagerError(f"worker state exchange: a frame of {size} bytes is larger than {MAX_FRAME}")
    return json.loads(_exactly(sock, size, deadline, parent))


def _exactly(sock: socket.socket, size: int, deadline: float, parent: int) -> bytes:
    chunks, left = [], size
    while left:
        _wait_readable(sock, deadline, parent)
        chunk = sock.recv(left)
        if not chunk:
            raise ConnectionError("the other side closed the exchange")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def exchange(name: str, member: int, members: int, payload: Any, timeout: float) -> list[Any]:
    """Every member's ``payload`` (JSON data), in member order, once all ``members`` called with ``name``.

    Args:
        name: what the members share and no other group has.
        member: this caller's number, in ``[0, members)``.
        members: how many meet.
        payload: this member's contribution (JSON-serialisable).
        timeout: seconds to wait for every member.

    Raises:
        StagerError: some member did not come within ``timeout``, or the exchange broke.
    """
    if members == 1:
        return [payload]
    address = "\0stager-exchange-" + name
    deadline = time.monotonic() + timeout
    parent = os.getppid()
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            _check_parent(parent)
            hub = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                hub.bind(address)
            except OSError as exc:
                hub.close()
                if exc.errno != errno.EADDRINUSE:
                    raise
            else:
                with hub:
                    return _collect(hub, member, members, payload, deadline, parent)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with sock:
                sock.settimeout(left)
                try:
                    sock.connect(address)
                except (ConnectionRefusedError, FileNotFoundError):
                    time.sleep(_RETRY)  # bound, not listening yet (or just closed): try again
                    continue
                _send(sock, [member, payload])
                everyone = _receive(sock, deadline, parent)
                if not isinstance(everyone, list):
                    raise TimeoutError  # the hub gave up waiting for some member: the same failure here
                return everyone
    except StagerError as exc:
        raise StagerError(f"DataLoader worker {member} of {members}: {exc}") from None
    except (TimeoutError, socket.timeout) as exc:
        raise StagerError(f"DataLoader worker {member} of {members}: not every worker of the loader started "
                          f"within {timeout:.0f} s to share the resume state (did a worker die?)") from exc
    except (OSError, ValueError) as exc:
        raise StagerError(f"DataLoader worker {member} of {members}: the resume state exchange failed: "
                          f"{exc}") from exc


def _collect(hub: socket.socket, member: int, members: int, payload: Any, deadline: float,
             parent: int) -> list[Any]:
    hub.listen(members)
    got: dict[int, Any] = {member: payload}
    peers: list[socket.socket] = []
    try:
        while len(got) < members:
            _wait_readable(hub, deadline, parent)
            hub.settimeout(max(deadline - time.monotonic(), 0.001))
            peer, _ = hub.accept()
            peers.append(peer)
            peer.settimeout(max(deadline - time.monotonic(), 0.001))
            who, theirs = _receive(peer, deadline, parent)
            got.setdefault(int(who), theirs)
        if sorted(got) != list(range(members)):
            raise ValueError(f"members {sorted(got)} are not 0..{members - 1}")
        everyone = [got[k] for k in range(members)]
        for peer in peers:
            _send(peer, everyone)
        return everyone
    except (TimeoutError, StagerError):
        for peer in peers:  # the members that came are told, so they fail now, as this one does
            try:
                _send(peer, {"gave_up": len(got)})
            except OSError:
                pass
        raise
    finally:
        for peer in peers:
            peer.close()
