"""Who is in the cluster, from what the cluster already has: a list, Slurm, DNS or a file; and who answers.

``--peers SPEC`` is one of

- ``host:port,host:port,...``: a fixed list (a bare ``host`` takes the port of ``--peer-listen``);
- ``slurm``: the hosts of ``SLURM_JOB_NODELIST`` (every bracket form, ``slurm.py``), each on the
  port of ``--peer-listen``;
- ``dns:NAME`` or ``dns:NAME:PORT``: the A and AAAA records of NAME (a Kubernetes headless
  Service), resolved again every ``refresh`` seconds;
- ``file:PATH``: one address a line (``#`` starts a comment), read again when the file changes.

The list names every node, this one included; a node recognises its own
entry (the same port as ``--peer-listen`` on one of its own addresses, or its
host name) and uses that entry as its id, so that every node ranks the same
ids (``placement.py``). No coordinator and no consensus: each node keeps its
own view. Peers start out presumed alive; one that fails a request or a
health check (``GET /healthz``) is skipped until it answers one again.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .slurm import expand_hostlist

log = logging.getLogger(__name__)

KINDS = ("list", "slurm", "dns", "file")
#: Health checks in a row without an answer before a peer counts as down (a refusal counts at once):
#: a node busy starting its consumers must not drop out of everyone's ring for a moment.
SILENT_CHECKS = 3
#: Live peers health-checked per round, and down peers (a failed request marks one down at once anyway).
CHECKS_PER_ROUND = 32
WILDCARDS = frozenset({"", "0.0.0.0", "::"})


@dataclass(frozen=True, slots=True)
class PeerSpec:
    """A parsed ``--peers``: its kind, its text (list, DNS name or file path) and the default port."""

    kind: str
    value: str
    port: int

    def __str__(self) -> str:
        return self.value if self.kind == "list" else "slurm" if self.kind == "slurm" else f"{self.kind}:{self.value}"


def split_address(text: str, default_port: int | None, *, what: str = "--peers") -> tuple[str, int]:
    """``host:port``, ``[v6]:port``, ``v6`` or ``host`` (then ``default_port``) to (host, port).

    Raises:
        ConfigError: no host, a port that is not in 1..65535, or no port and no default.
    """
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ConfigError(f"{what}: {text!r} is not an address ([v6]:port)")
        port_text = rest[1:] if rest else ""
    elif text.count(":") > 1:  # a bare IPv6 address
        host, port_text = text, ""
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise ConfigError(f"{what}: {text!r} names no host")
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
            raise ConfigError(f"{what}: {text!r}: the port must be a number in 1..65535")
        return host, int(port_text)
    if default_port is None or default_port == 0:
        raise ConfigError(f"{what}: {text!r} has no port, and --peer-listen gives none to take")
    return host, default_port


def member_id(host: str, port: int) -> str:
    """The id of a member: ``host:port`` (``[v6]:port`` for an IPv6 address)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_peer_spec(text: str, listen_port: int) -> PeerSpec:
    """Check ``--peers`` and say what kind it is (nothing is resolved or read yet).

    Raises:
        ConfigError: an empty spec, a ``dns:`` or ``file:`` without a name, or a bad address in a list.
    """
    text = str(text).strip()
    if not text:
        raise ConfigError("--peers: empty; give host:port,..., slurm, dns:NAME or file:PATH")
    if text == "slurm":
        return PeerSpec("slurm", "", listen_port)
    if text.startswith("dns:"):
        name = text[4:]
        host, port = split_address(name, listen_port) if name else ("", 0)
        if not host:
            raise ConfigError("--peers dns:NAME needs a DNS name (a Kubernetes headless Service)")
        return PeerSpec("dns", host, port)
    if text.startswith("file:"):
        if not text[5:]:
            raise ConfigError("--peers file:PATH needs a path")
        return PeerSpec("file", text[5:], listen_port)
    for item in text.split(","):
        split_address(item, listen_port)
    return PeerSpec("list", text, listen_port)


def read_members(spec: PeerSpec, environ: Mapping[str, str] | None = None) -> list[tuple[str, int]]:
    """The (host, port) pairs a list, ``slurm`` or ``file:`` spec names (``dns:`` is resolved elsewhere).

    Raises:
        ConfigError: SLURM_JOB_NODELIST unset or malformed, the file unreadable, or a bad line in it.
    """
    env = os.environ if environ is None else environ
    if spec.kind == "list":
        return [split_address(item, spec.port) for item in spec.value.split(",")]
    if spec.kind == "slurm":
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            raise ConfigError("--peers slurm: SLURM_JOB_NODELIST is not set (run inside a Slurm job, "
                              "e.g. from the prolog)")
        return [(host, spec.port) for host in expand_hostlist(nodelist)]
    if spec.kind == "file":
        try:
            lines = Path(spec.value).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--peers file:{spec.value}: cannot read it: {getattr(exc, 'strerror', None) or exc}") \
                from exc
        members = []
        for number, line in enumerate(lines, 1):
            line = line.split("#", 1)[0].strip()
            if line:
                members.append(split_address(line, spec.port, what=f"--peers file:{spec.value} line {number}"))
        return members
    raise ValueError(f"no members to read for a {spec.kind} spec")


async def resolve(host: str, port: int) -> set[str]:
    """The IP addresses of ``host`` (empty if it does not resolve), without blocking the loop."""
    try:
        ipaddress.ip_address(host)
        return {host}
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return set()
    return {info[4][0] for info in infos}


async def local_addresses(listen_host: str) -> set[str]:
    """The addresses a member entry may name this node by."""
    if listen_host not in WILDCARDS:
        return await resolve(listen_host, 0) | {listen_host}
    found = {"127.0.0.1", "::1"}
    for name in {socket.gethostname(), socket.getfqdn()}:
        found |= await resolve(name, 0)
    return found


class Membership:
    """This node's view of the cluster: every member's id, its own, and which peers are down.

    Args:
        spec: the parsed ``--peers``.
        listen: this node's ``--peer-listen`` (host, port).
        environ: where ``SLURM_JOB_NODELIST`` is read.
        refresh: seconds between DNS look-ups and file checks.
        clock: monotonic time, for how long a peer has been down.
    """

    def __init__(self, spec: PeerSpec, listen: tuple[str, int], *, environ: Mapping[str, str] | None = None,
                 refresh: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self.listen = listen
        self.refresh_interval = refresh
        self._environ = environ
        self._clock = clock
        self.me = member_id(*listen)
        self.members: tuple[str, ...] = (self.me,)
        self._down: dict[str, float] = {}
        self._file_stamp: tuple[int, int] | None = None
        self._local: set[str] = set()
        self.changes = 0  # how many times the member list changed
        self._on_down: list[Callable[[str], None]] = []

    @property
    def peers(self) -> list[str]:
        """Every other member, alive or not."""
        return [m for m in self.members if m != self.me]

    def live(self) -> list[str]:
        """The members to rank blobs over: this node and every peer not found down."""
        return [m for m in self.members if m == self.me or m not in self._down]

    def down(self) -> list[str]:
        return [m for m in self.members if m in self._down]

    def on_down(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(peer)`` each time a peer is found down (to give up what waits on it)."""
        self._on_down.append(callback)

    def mark_down(self, peer: str, why: str) -> None:
        if peer != self.me and peer in self.members and peer not in self._down:
            self._down[peer] = self._clock()
            log.warning("peer %s is down (%s): skipped until it answers a health check", peer, why)
            for callback in self._on_down:
                callback(peer)

    def mark_up(self, peer: str) -> None:
        if self._down.pop(peer, None) is not None:
            log.info("peer %s answers again", peer)

    async def load(self) -> None:
        """Read (or resolve) the member list once; the first time, also learn this node's own addresses.

        Raises:
            ConfigError: the spec cannot be read at all (at start-up; later failures keep the old list).
        """
        if not self._local:
            self._local = await local_addresses(self.listen[0])
        if self.spec.kind == "file":
            self._file_stamp = self._stamp()
        pairs = await self._pairs()
        await self._adopt(pairs)

    async def _pairs(self) -> list[tuple[str, int]]:
        if self.spec.kind == "dns":
            addresses = await resolve(self.spec.value, self.spec.port)
            return [(ip, self.spec.port) for ip in sorted(addresses)]
        return read_members(self.spec, self._environ)

    async def _adopt(self, pairs: list[tuple[str, int]]) -> None:
        me = None
        hostnames = {socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn()}
        ids = []
        for host, port in pairs:
            ident = member_id(host, port)
            if ident in ids:
                continue
            ids.append(ident)
            if me is None and port == self.listen[1] and (
                    host == self.listen[0] or (self.listen[0] in WILDCARDS and host in hostnames)
                    or (await resolve(host, port)) & self._local):
                me = ident
        self.me = me or member_id(*self.listen)
        members = tuple(sorted(set(ids) | {self.me}))
        if members != self.members:
            if self.changes or len(members) > 1:
                log.info("cluster members (%d, this node is %s): %s", len(members), self.me, ", ".join(members))
            self.members = members
            self.changes += 1
            self._down = {m: t for m, t in self._down.items() if m in members}

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.spec.value)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    async def refresh(self) -> bool:
        """Look again (DNS, or the file if it changed); True if the member list changed. Never raises."""
        before = self.members
        try:
            if self.spec.kind == "file":
                stamp = self._stamp()
                if stamp == self._file_stamp or stamp is None:
                    return False
                self._file_stamp = stamp
            elif self.spec.kind != "dns":
                return False
            pairs = await self._pairs()
            if pairs:  # a DNS answer with no records (the Service is being rebuilt) keeps the old list
                await self._adopt(pairs)
        except ConfigError as exc:
            log.warning("keeping the member list: %s", exc)
        return self.members != before

    async def run(self, healthy: Callable[[str], Awaitable[bool | None]], interval: float) -> None:
        """Forever: health-check peers every ``interval`` seconds, and refresh the list when due.

        ``healthy(peer)`` is True (it answers), False (it refuses: down at once) or None (no answer in
        time: down after :data:`SILENT_CHECKS` in a row). Each round checks at most
        :data:`CHECKS_PER_ROUND` peers (in turn, so a large cluster is swept over several rounds
        rather than every node asking every other one every 2 s) and at most as many down ones."""
        next_refresh = self._clock() + self.refresh_interval
        silent: dict[str, int] = {}
        turn = 0
        while True:
            everyone = self.peers
            if len(everyone) > CHECKS_PER_ROUND:
                turn %= len(everyone)
                chosen = (everyone + everyone)[turn:turn + CHECKS_PER_ROUND]
                turn += CHECKS_PER_ROUND
            else:
                chosen = everyone
            peers = list(dict.fromkeys(chosen + self.down()[:CHECKS_PER_ROUND]))
            if peers:
                answers = await asyncio.gather(*(healthy(p) for p in peers))
                for peer, ok in zip(peers, answers, strict=True):
                    silent[peer] = 0 if ok is not None else silent.get(peer, 0) + 1
                    if ok:
                        self.mark_up(peer)
                    elif ok is False:
                        self.mark_down(peer, "it refuses health checks")
                    elif silent[peer] >= SILENT_CHECKS:
                        self.mark_down(peer, f"no answer to {SILENT_CHECKS} health checks in a row")
            if self._clock() >= next_refresh or self.spec.kind == "file":
                next_refresh = self._clock() + self.refresh_interval
                await self.refresh()
                silent = {p: n for p, n in silent.items() if p in self.members}
            await asyncio.sleep(interval)
