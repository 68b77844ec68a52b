"""Rendezvous placement: a join or a leave moves only that member's share; the spreading tree's shape."""

from __future__ import annotations

import secrets

from stager.cluster.placement import PeerRing, children_in, first_block_in, ranked, share, upstream_in

DIGESTS = [secrets.token_hex(16) for _ in range(4000)]
MEMBERS = [f"127.0.0.{i}:7070" for i in range(2, 12)]


def owners(members):
    return {d: ranked(d, members)[0] for d in DIGESTS}


def test_a_join_takes_only_blobs_for_the_new_member():
    before = owners(MEMBERS)
    joined = "127.0.0.99:7070"
    after = owners([*MEMBERS, joined])
    moved = [d for d in DIGESTS if before[d] != after[d]]
    assert moved and all(after[d] == joined for d in moved)
    assert abs(len(moved) - len(DIGESTS) / 11) < len(DIGESTS) / 11 * 0.3  # about its fair share


def test_a_leave_hands_only_the_leavers_blobs_to_their_next_ranked():
    before = owners(MEMBERS)
    gone = MEMBERS[3]
    after = owners([m for m in MEMBERS if m != gone])
    for d in DIGESTS:
        if before[d] == gone:
            assert after[d] == ranked(d, MEMBERS)[1]
        else:
            assert after[d] == before[d]


def test_every_member_sees_the_same_owner_and_shares_are_even():
    rings = [PeerRing(MEMBERS, me) for me in MEMBERS]
    for d in DIGESTS[:200]:
        assert len({r.owner(d) for r in rings}) == 1
    counts = share(MEMBERS, DIGESTS)
    assert min(counts.values()) > len(DIGESTS) / len(MEMBERS) * 0.7


def test_the_spreading_tree_bounds_what_a_node_sends_and_reaches_the_owner():
    members = [f"10.0.{i // 250}.{i % 250}:7070" for i in range(1000)]
    digest = DIGESTS[0]
    order = PeerRing(members, members[0], fanout=4).ranking(digest)  # the same on every node
    asked = {m: 0 for m in members}
    depth = 0
    for me in members:
        chain = upstream_in(order, me, 4)
        if me == order[0]:
            assert chain == []
            continue
        assert chain[-1] == order[0]
        asked[chain[0]] += 1
        depth = max(depth, len(chain))
        assert me in children_in(order, chain[0], 4)
    assert max(asked.values()) <= 4  # each node is asked first by at most `fanout` others
    assert depth <= 5  # log4(1000) ~ 5
    ring = PeerRing(members, order[5], fanout=4)
    assert ring.upstream(digest) == upstream_in(order, order[5], 4) and ring.children(digest) == order[21:25]


def test_a_node_outside_the_members_asks_the_owner_and_owns_nothing():
    ring = PeerRing(MEMBERS, "127.0.0.200:7070")
    for d in DIGESTS[:50]:
        assert not ring.is_owner(d) and ring.upstream(d) == [ranked(d, MEMBERS)[0]]


def test_the_owners_children_start_a_blob_a_fanout_th_of_a_request_apart_and_deeper_nodes_as_their_ancestor():
    order = [f"10.0.0.{i}:7070" for i in range(30)]
    assert first_block_in(order, order[0], 4, 8) == 0  # the owner
    assert [first_block_in(order, m, 4, 8) for m in order[1:5]] == [0, 2, 4, 6]  # the owner's children
    assert [first_block_in(order, m, 4, 8) for m in order[5:9]] == [0, 0, 0, 0]  # rank 1's: as rank 1
    assert [first_block_in(order, m, 4, 8) for m in order[9:13]] == [2, 2, 2, 2]  # rank 2's: as rank 2
    assert first_block_in(order, order[21], 4, 8) == 0  # rank 21: its parent is 5, whose is 1
    assert first_block_in(order, "10.9.9.9:7070", 4, 8) == 0  # not a member
    assert [first_block_in(order, m, 4, 5) for m in order[1:5]] == [0, 1, 2, 3]
    small = order[:4]  # an owner with three children: a third of a request apart, each child's run as long
    assert [first_block_in(small, m, 4, 9) for m in small] == [0, 0, 3, 6]
    assert [first_block_in(order[:2], m, 4, 8) for m in order[:2]] == [0, 0]
