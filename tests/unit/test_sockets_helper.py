"""tests.helpers.sockets reads this process's own listening sockets back from /proc: IPv4 and IPv6, listening ones
only (not a connected socket, not a closed one)."""

from __future__ import annotations

import os
import socket

import pytest

from tests.helpers.sockets import _address, walk_listening_sockets


def test_addresses_are_decoded_from_procs_word_order() -> None:
    assert _address("0100007F:1F90") == ("127.0.0.1", 8080)
    assert _address("00000000:0050") == ("0.0.0.0", 80)
    assert _address("00000000000000000000000001000000:01BB") == ("::1", 443)
    assert _address("0000000000000000FFFF00000100007F:2F8F") == ("127.0.0.1", 12175)  # IPv4 on a tcp6 socket


def test_the_walk_finds_this_processs_listening_sockets_only() -> None:
    with socket.socket() as listening, socket.socket() as connected:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        connected.connect(("127.0.0.1", port))  # an established socket to it: not a listening one
        found = walk_listening_sockets([os.getpid()])
        assert ("127.0.0.1", port) in found
        assert all(p != connected.getsockname()[1] for _, p in found)
    assert ("127.0.0.1", port) not in walk_listening_sockets([os.getpid()])
    assert walk_listening_sockets([2**22 + 12345]) == []  # no such process


def test_the_walk_reads_ipv6_too() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    with socket.socket(socket.AF_INET6) as six:
        try:
            six.bind(("::1", 0))
        except OSError:
            pytest.skip("no ::1 here")
        six.listen()
        assert ("::1", six.getsockname()[1]) in walk_listening_sockets([os.getpid()])
