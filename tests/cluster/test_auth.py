"""Signed peer requests: a valid one passes once; a bad, stale, replayed or altered one is refused."""

from __future__ import annotations

import pytest

from stager.cluster.auth import PeerAuth, load_secret
from stager.errors import ConfigError

SECRET = b"a-cluster-secret-of-32-bytes-ok!"
DIGEST = "0123456789abcdef0123456789abcdef"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_signed_request_passes_once_and_its_replay_is_refused():
    clock = Clock()
    sender, receiver = PeerAuth(SECRET, clock=clock), PeerAuth(SECRET, clock=clock)
    headers = sender.sign("GET", DIGEST, 0, 100, "ctx")
    assert receiver.check("GET", DIGEST, 0, 100, "ctx", headers) is None
    assert receiver.check("GET", DIGEST, 0, 100, "ctx", headers) == "replayed nonce"


@pytest.mark.parametrize("change, problem", [
    (lambda a: ("GET", DIGEST, 0, 101, "ctx"), "bad signature"),  # another range
    (lambda a: ("HEAD", DIGEST, 0, 100, "ctx"), "bad signature"),
    (lambda a: ("GET", "f" * 32, 0, 100, "ctx"), "bad signature"),
    (lambda a: ("GET", DIGEST, 0, 100, "other"), "bad signature"),  # another dataset or mode
])
def test_any_altered_field_is_refused(change, problem):
    clock = Clock()
    headers = PeerAuth(SECRET, clock=clock).sign("GET", DIGEST, 0, 100, "ctx")
    assert PeerAuth(SECRET, clock=clock).check(*change(None), headers) == problem


def test_another_secret_no_signature_and_a_stale_time_are_refused():
    clock = Clock()
    receiver = PeerAuth(SECRET, clock=clock)
    other = PeerAuth(b"another-secret-of-enough-bytes!!", clock=clock).sign("GET", DIGEST, 0, 1, "")
    assert receiver.check("GET", DIGEST, 0, 1, "", other) == "bad signature"
    assert receiver.check("GET", DIGEST, 0, 1, "", {}) == "no signature"
    old = PeerAuth(SECRET, clock=clock).sign("GET", DIGEST, 0, 1, "")
    clock.now += 31
    assert receiver.check("GET", DIGEST, 0, 1, "", old).startswith("stale time")
    clock.now -= 62
    assert receiver.check("GET", DIGEST, 0, 1, "", old).startswith("stale time")


def test_nonces_are_forgotten_only_once_their_time_alone_refuses_them():
    clock = Clock()
    sender, receiver = PeerAuth(SECRET, clock=clock), PeerAuth(SECRET, clock=clock)
    headers = sender.sign("GET", DIGEST, 0, 1, "")
    assert receiver.check("GET", DIGEST, 0, 1, "", headers) is None
    for _ in range(10):
        clock.now += 10
        receiver.check("GET", DIGEST, 0, 1, "", sender.sign("GET", DIGEST, 0, 1, ""))  # prunes
        assert receiver.check("GET", DIGEST, 0, 1, "", headers) is not None


def test_the_secret_comes_from_a_file_or_the_variable_and_must_be_long(tmp_path):
    path = tmp_path / "secret"
    path.write_text("x" * 20 + "\n")
    assert load_secret(str(path), {}) == b"x" * 20
    assert load_secret(None, {"STAGER_PEER_SECRET": "y" * 16}) == b"y" * 16
    path.write_text("short")
    with pytest.raises(ConfigError, match="needs at least 16"):
        load_secret(str(path), {})
    with pytest.raises(ConfigError, match="cannot read"):
        load_secret(str(tmp_path / "absent"), {})
    with pytest.raises(ConfigError, match="STAGER_PEER_SECRET"):
        load_secret(None, {})
    with pytest.raises(ConfigError) as caught:
        load_secret(None, {"STAGER_PEER_SECRET": "s3cr3t"})
    assert "s3cr3t" not in str(caught.value)
