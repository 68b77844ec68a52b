"""Owning the socket, in process: one owner per socket, stale sockets replaced, other files left alone."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from stager.daemon.config import DaemonConfig, parse_address
from stager.daemon.listener import SocketOwner, answers
from stager.daemon_client import default_socket_path
from stager.errors import ConfigError, DaemonError
from tests.daemon.support import remove_dir, short_dir


@pytest.fixture
def work():
    path = short_dir()
    try:
        yield path
    finally:
        remove_dir(path)


def test_one_owner_per_socket_and_the_second_is_told_who_owns_it(work):
    first = SocketOwner(work / "d.sock")
    first.acquire()
    try:
        sock = first.bind()
        with pytest.raises(DaemonError, match=rf"another stager daemon \(pid {os.getpid()}\) is already serving"):
            SocketOwner(work / "d.sock").acquire()
        assert answers(work / "d.sock")
        sock.close()
    finally:
        first.release()
    assert not (work / "d.sock").exists(), "release removes the socket it bound"
    second = SocketOwner(work / "d.sock")
    second.acquire()  # the lock went with the first owner
    second.release()


def test_bound_socket_has_mode_0600_whatever_the_umask(work):
    old = os.umask(0)
    try:
        owner = SocketOwner(work / "d.sock")
        owner.acquire()
        sock = owner.bind()
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.stat(work / "d.sock").st_mode) == 0o600
        assert sorted(p.name for p in work.iterdir()) == ["d.sock", "d.sock.lock"], "no temporary left behind"
    finally:
        sock.close()
        owner.release()


def test_a_stale_socket_is_replaced(work):
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(work / "d.sock"))
    stale.close()  # the file stays; nobody listens
    owner = SocketOwner(work / "d.sock")
    owner.acquire()
    sock = owner.bind()
    try:
        assert answers(work / "d.sock")
    finally:
        sock.close()
        owner.release()


def test_a_socket_another_program_serves_is_not_taken_over(work):
    foreign = socket.socket(socket.AF_UNIX)
    foreign.bind(str(work / "d.sock"))
    foreign.listen(1)
    try:
        with pytest.raises(DaemonError, match="already served by a live process"):
            SocketOwner(work / "d.sock").acquire()
        assert answers(work / "d.sock")
    finally:
        foreign.close()


def test_a_file_that_is_not_a_socket_is_left_alone(work):
    (work / "d.sock").write_text("precious")
    with pytest.raises(ConfigError, match="exists and is not a socket; refusing to replace it"):
        SocketOwner(work / "d.sock").acquire()
    assert (work / "d.sock").read_text() == "precious"


def test_the_socket_directory_is_made_private(work):
    owner = SocketOwner(work / "run" / "stager" / "d.sock")
    owner.acquire()
    try:
        assert stat.S_IMODE(os.stat(work / "run" / "stager").st_mode) == 0o700
    finally:
        owner.release()


def test_unknown_socket_group_is_a_config_error(work):
    with pytest.raises(ConfigError, match="no group named 'no-such-group-here'"):
        SocketOwner(work / "d.sock", "no-such-group-here")


def test_socket_path_too_long_is_a_config_error(work):
    with pytest.raises(ConfigError, match="a Unix socket path may have at most 107 bytes"):
        DaemonConfig(socket=work / ("x" * 120) / "d.sock")


@pytest.mark.parametrize("field,value,message", [
    ("drain_timeout", 0, "drain timeout"),
    ("lease", 0.5, "lease"),
    ("metrics_address", "localhost", "is not HOST:PORT"),
    ("metrics_address", "127.0.0.1:99999", "is not HOST:PORT"),
])
def test_bad_daemon_settings_are_config_errors(work, field, value, message):
    with pytest.raises(ConfigError, match=message):
        DaemonConfig(socket=work / "d.sock", **{field: value})


def test_metrics_address_forms():
    assert parse_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_address(":9464") == ("0.0.0.0", 9464)
    assert parse_address("[::1]:0") == ("::1", 0)


def test_default_socket_path_rules(tmp_path):
    system = tmp_path / "run-stager"
    assert default_socket_path({"STAGER_SOCKET": "/x/y.sock"}, uid=1000, system_dir=system) == \
        default_socket_path({"STAGER_SOCKET": "/x/y.sock"}, uid=0)
    assert str(default_socket_path({"STAGER_SOCKET": "/x/y.sock"}, uid=1000, system_dir=system)) == "/x/y.sock"
    assert default_socket_path({}, uid=0, system_dir=system) == system / "stager.sock"
    assert default_socket_path({"XDG_RUNTIME_DIR": "/run/user/1000"}, uid=1000, system_dir=system) == \
        Path("/run/user/1000/stager/stager.sock")
    assert str(default_socket_path({}, uid=1000, system_dir=system)) == "/tmp/stager-1000/stager.sock"
    system.mkdir()  # the systemd unit's RuntimeDirectory: every user who may enter it uses it
    assert default_socket_path({"XDG_RUNTIME_DIR": "/run/user/1000"}, uid=1000, system_dir=system) == \
        system / "stager.sock"


async def test_a_metrics_address_in_use_is_a_config_error(node):
    import socket as _socket

    taken = _socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        with pytest.raises(ConfigError, match=r"--metrics-address 127\.0\.0\.1:\d+: cannot listen there"):
            await node.start(metrics_address=f"127.0.0.1:{taken.getsockname()[1]}")
        assert not node.socket.exists(), "a daemon that failed to start leaves no socket behind"
        await node.start()  # nor its lock
    finally:
        taken.close()
