"""cocotb test module that serves the tile's bus to a host process over a socket.

Run by :class:`fusetile.sim.cocotb_transport.CocotbTransport` as the simulator's
only test. It starts the clock, resets the tile, connects to the Unix socket named by
``FUSETILE_SOCKET`` and serves requests from a thread started with
``cocotb.task.bridge``. While that thread waits for the next request the simulator
stands still (a bridge thread blocks the scheduler until it calls a ``resume``-d
function or returns), so the tile's clock only runs while the host asks it to.

The test ends (and the simulator exits) on a SHUTDOWN request or when the host
closes the connection, including when the host process dies.
"""

import os
import socket

import cocotb
from cocotb.task import bridge, resume

from ..host.transport import BusError, TransportError
from .cocotb_transport import (
    REQUEST, REPLY, OP_READ, OP_WRITE, OP_WAIT, OP_IRQ, OP_SHUTDOWN,
    ST_OK, ST_BUS_ERROR, ST_FAILURE, bytes_to_words, words_to_bytes,
)
from .process import recv_exact
from .tb import TB


def _serve(tb, path):
    read = resume(tb.read_burst)
    write = resume(tb.write_burst)
    wait = resume(tb.cycles)

    async def get_irq():
        return tb.irq
    irq = resume(get_irq)

    def ok(words=()):
        return REPLY.pack(ST_OK, 0, len(words)) + words_to_bytes(list(words))

    def failure(message):
        blob = message.encode()
        return REPLY.pack(ST_FAILURE, 0, len(blob)) + blob

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        while True:
            try:
                header = recv_exact(sock, REQUEST.size)
            except OSError:
                return "connection lost"
            if header is None:
                return "host closed the connection"
            op, increment, addr, count = REQUEST.unpack(header)
            try:
                if op == OP_READ:
                    reply = ok(read(addr, count, increment=bool(increment)))
                elif op == OP_WRITE:
                    values = bytes_to_words(recv_exact(sock, 4 * count) or b"")
                    write(addr, values, increment=bool(increment))
                    reply = ok()
                elif op == OP_WAIT:
                    wait(count)
                    reply = ok()
                elif op == OP_IRQ:
                    reply = ok([irq()])
                elif op == OP_SHUTDOWN:
                    sock.sendall(ok())
                    return "shutdown"
                else:
                    reply = failure(f"unknown request {op}")
            except BusError as e:
                reply = REPLY.pack(ST_BUS_ERROR, e.addr, int(e.write))
            except (TransportError, ValueError) as e:
                reply = failure(f"{type(e).__name__}: {e}")
            try:
                sock.sendall(reply)
            except OSError:
                return "connection lost"


@cocotb.test()
async def serve(dut):
    """Serve the bus of ``dut`` to the host at ``FUSETILE_SOCKET`` until it leaves."""
    tb = TB(dut, bus_timeout=int(os.environ.get("FUSETILE_BUS_TIMEOUT", "256")))
    await tb.reset()
    why = await bridge(_serve)(tb, os.environ["FUSETILE_SOCKET"])
    dut._log.info("bus server stopped: %s", why)
