"""Ports for private stacks and clusters are drawn below the kernel's ephemeral range: a port
from that range can be taken as the local port of any outgoing connection before the service
binds it, or while a killed node is down (a cluster node once failed to start on such a port)."""

import socket

from infra.stack import _ephemeral_ports, free_port_block, port_free


def test_a_block_lies_below_the_ephemeral_range_and_is_free():
    low, _ = _ephemeral_ports()
    for width in (1, 2, 6):
        base = free_port_block(width)
        assert 20000 <= base and base + width <= low
        assert all(port_free(base + i) for i in range(width))


def test_a_block_skips_a_port_in_use(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        import infra.stack as stack

        draws = iter([busy, busy + 1000])  # the first draw's block holds the busy port
        monkeypatch.setattr("random.Random.randrange", lambda self, a, b: next(draws))
        monkeypatch.setattr(stack, "port_free", lambda p: p != busy)
        assert free_port_block(2) == busy + 1000
