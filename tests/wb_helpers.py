"""Wishbone classic initiator helpers for Amaranth async testbenches.

    status = await wb_write(ctx, bus, word_addr, data)          # "ack" or "err"
    data, status = await wb_read(ctx, bus, word_addr)

``bus`` is the interface the design's slave port is (its ``cyc``/``stb``/... must be
left undriven by the design). Each call presents one access, waits for ``ack`` or
``err`` and completes the transfer at the clock edge where the answer is sampled, then
releases the bus; it returns with the clock just past that edge. A slave that does not
answer within ``timeout`` cycles raises :class:`TimeoutError` instead of hanging.
"""

import gc
import re
import warnings

import pytest
from amaranth.hdl import UnusedElaboratable


__all__ = ["wb_write", "wb_read", "WB_TIMEOUT", "raises_in_constructor"]


WB_TIMEOUT = 32


async def _access(ctx, bus, word_addr, *, we, data=0, sel=0xF, timeout=WB_TIMEOUT):
    ctx.set(bus.cyc, 1)
    ctx.set(bus.stb, 1)
    ctx.set(bus.we, we)
    ctx.set(bus.adr, word_addr)
    ctx.set(bus.dat_w, data)
    ctx.set(bus.sel, sel)
    try:
        for _ in range(timeout + 1):
            ack, err = ctx.get(bus.ack), ctx.get(bus.err)
            if ack and err:
                raise AssertionError(f"Wishbone slave answered {'write' if we else 'read'} "
                                     f"of word {word_addr:#x} with both ack and err")
            if ack or err:
                rdata = ctx.get(bus.dat_r)
                await ctx.tick()
                return rdata, "ack" if ack else "err"
            await ctx.tick()
        raise TimeoutError(f"Wishbone {'write' if we else 'read'} of word {word_addr:#x}: "
                           f"no ack or err within {timeout} cycles")
    finally:
        ctx.set(bus.cyc, 0)
        ctx.set(bus.stb, 0)
        ctx.set(bus.we, 0)


async def wb_write(ctx, bus, word_addr, data, sel=0xF, *, timeout=WB_TIMEOUT):
    """Write ``data`` to word ``word_addr``; return ``"ack"`` or ``"err"``."""
    _, status = await _access(ctx, bus, word_addr, we=1, data=data, sel=sel, timeout=timeout)
    return status


async def wb_read(ctx, bus, word_addr, *, timeout=WB_TIMEOUT):
    """Read word ``word_addr``; return ``(data, "ack" | "err")`` (data is 0 on err)."""
    data, status = await _access(ctx, bus, word_addr, we=0, timeout=timeout)
    return (data if status == "ack" else 0), status


def raises_in_constructor(exc, match, cls, *args, **kwargs):
    """Check that ``cls(*args, **kwargs)`` raises ``exc`` with a message matching ``match``.

    A component object exists (and is never used) before its constructor raises; it is
    collected here so that its ``UnusedElaboratable`` warning does not land in a later
    test.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        try:
            cls(*args, **kwargs)
        except exc as e:
            message = str(e)
        else:
            pytest.fail(f"{cls.__name__}(...) did not raise {exc.__name__}")
        gc.collect()
    assert re.search(match, message), f"{message!r} does not match {match!r}"
