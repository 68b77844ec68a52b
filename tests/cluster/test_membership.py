"""Member lists from each spec kind, this node's own entry found, and a file read again when it changes."""

from __future__ import annotations

import asyncio
import os

import pytest

from stager.cluster.membership import Membership, parse_peer_spec, read_members, split_address
from stager.cluster.placement import ranked
from stager.errors import ConfigError

LISTEN = ("127.0.0.3", 7070)


async def loaded(spec: str, environ: dict[str, str] | None = None) -> Membership:
    membership = Membership(parse_peer_spec(spec, LISTEN[1]), LISTEN, environ=environ or {})
    await membership.load()
    return membership


async def test_a_list_names_every_member_and_this_node_finds_its_own_entry():
    m = await loaded("127.0.0.2:7070,127.0.0.3:7070,127.0.0.4")
    assert m.me == "127.0.0.3:7070"
    assert m.members == ("127.0.0.2:7070", "127.0.0.3:7070", "127.0.0.4:7070")
    assert m.peers == ["127.0.0.2:7070", "127.0.0.4:7070"]


async def test_slurm_expands_the_node_list_on_the_listen_port():
    m = await loaded("slurm", {"SLURM_JOB_NODELIST": "127.0.0.[2-4]"})
    assert m.members == ("127.0.0.2:7070", "127.0.0.3:7070", "127.0.0.4:7070") and m.me == "127.0.0.3:7070"
    with pytest.raises(ConfigError, match="SLURM_JOB_NODELIST is not set"):
        await loaded("slurm", {})


async def test_dns_names_every_address_of_the_name():
    m = Membership(parse_peer_spec("dns:localhost", 7070), ("127.0.0.1", 7070), environ={})
    await m.load()
    assert "127.0.0.1:7070" in m.members and m.me == "127.0.0.1:7070"


async def test_a_file_is_read_again_when_it_changes_and_a_join_moves_only_its_own_share(tmp_path):
    path = tmp_path / "members"
    path.write_text("# the cluster\n127.0.0.2:7070\n127.0.0.3:7070\n\n")
    m = await loaded(f"file:{path}")
    assert m.members == ("127.0.0.2:7070", "127.0.0.3:7070")
    assert not await m.refresh()  # unchanged
    digests = [f"{i:032x}" for i in range(500)]
    before = {d: ranked(d, m.live())[0] for d in digests}
    path.write_text("127.0.0.2:7070\n127.0.0.3:7070\n127.0.0.5:7070\n")
    os.utime(path, ns=(1, 1))  # a new stamp even within the file system's time resolution
    assert await m.refresh()
    after = {d: ranked(d, m.live())[0] for d in digests}
    assert all(after[d] in (before[d], "127.0.0.5:7070") for d in digests)
    path.write_text("127.0.0.2:7070\n")
    os.utime(path, ns=(2, 2))
    assert await m.refresh() and m.members == ("127.0.0.2:7070", "127.0.0.3:7070")  # itself stays in


async def test_peers_found_down_leave_the_live_list_until_they_answer():
    m = await loaded("127.0.0.2:7070,127.0.0.3:7070,127.0.0.4:7070")
    m.mark_down("127.0.0.2:7070", "test")
    assert m.live() == ["127.0.0.3:7070", "127.0.0.4:7070"] and m.down() == ["127.0.0.2:7070"]
    m.mark_up("127.0.0.2:7070")
    assert len(m.live()) == 3


@pytest.mark.parametrize("spec, problem", [
    ("", "empty"),
    ("dns:", "needs a DNS name"),
    ("file:", "needs a path"),
    ("a:b", "the port must be a number"),
    ("a:70000", "the port must be a number"),
    ("127.0.0.2:7070,,x", "names no host"),
])
def test_bad_specs_get_one_line(spec, problem):
    with pytest.raises(ConfigError, match=problem):
        parse_peer_spec(spec, 7070)


def test_addresses_take_the_default_port_and_ipv6_brackets():
    assert split_address("[::1]:80", 1) == ("::1", 80)
    assert split_address("::1", 7) == ("::1", 7)
    assert split_address("host", 7) == ("host", 7)
    with pytest.raises(ConfigError, match="no port"):
        split_address("host", None)


def test_a_bad_line_in_the_file_is_named(tmp_path):
    path = tmp_path / "members"
    path.write_text("127.0.0.2:7070\n127.0.0.3:port\n")
    with pytest.raises(ConfigError, match="line 2"):
        read_members(parse_peer_spec(f"file:{path}", 7070))


async def test_health_checks_sweep_a_large_cluster_in_turns_and_bring_the_down_back():
    members = ",".join(f"10.1.{i // 250}.{i % 250}:7070" for i in range(100)) + ",127.0.0.3:7070"
    m = await loaded(members)
    asked: list[str] = []

    async def healthy(peer: str) -> bool | None:
        asked.append(peer)
        return peer != "10.1.0.1:7070" or len(asked) > 150

    task = asyncio.create_task(m.run(healthy, 0.001))
    try:
        for _ in range(2000):  # bounded
            if len(asked) >= 200:
                break
            await asyncio.sleep(0.001)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    peers = {f"10.1.{i // 250}.{i % 250}:7070" for i in range(100)}
    assert peers <= set(asked[:4 * 33])  # 32 a round in turn (and the down one again): all within four rounds
    assert "10.1.0.1:7070" not in m.down()  # refused, then answered again
