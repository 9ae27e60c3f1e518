"""The trace FIFO: one record per kernel call, drained by the host in bursts."""

from amaranth.hdl import Module, Signal, Array
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..kernels.isa import TraceRecord
from .regmap import TRACE_WORDS


__all__ = ["TraceFifo", "TRACE_WORDS"]




class TraceFifo(wiring.Component):
    """A FIFO of :class:`TraceRecord` read 32 bits at a time.

    The host reads ``data`` repeatedly from one address (TRACE_DATA); each read
    advances to the record's next word, and reading the last word pops the record, so
    a non-incrementing burst of ``level * TRACE_WORDS`` reads drains the FIFO. A record
    pushed while the FIFO is full is dropped and counted: tracing never stalls the tile.

    A pushed record is written the cycle after ``push`` (``push`` and ``record`` are
    registered, so the control unit's decision to push and the FIFO's pointers are
    separate paths); a ``clear`` in the cycle of the push drops it, as if the write
    had been immediate.

    Parameters
    ----------
    depth : int
        Records held (a power of two).

    Attributes
    ----------
    push : In(1)
        Append ``record`` (written in the next cycle).
    record : In(TraceRecord)
    read : In(1)
        The host read ``data`` this cycle: advance.
    data : Out(32)
        The current word of the head record (0 when empty).
    level : Out(16)
        Records held.
    dropped : Out(16)
        Records dropped because the FIFO was full (saturating).
    clear : In(1)
        Empty the FIFO and zero ``dropped``.
    """

    push: In(1)
    record: In(TraceRecord)
    read: In(1)
    data: Out(32)
    level: Out(16)
    dropped: Out(16)
    clear: In(1)

    def __init__(self, depth):
        if not isinstance(depth, int) or depth < 2 or depth & (depth - 1):
            raise ValueError(f"depth must be a power of two >= 2, not {depth!r}")
        self.depth = depth
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        ptr_bits = self.depth.bit_length() - 1
        m.submodules.mem = mem = Memory(shape=TraceRecord.as_shape().size, depth=self.depth,
                                        init=[])
        wr = mem.write_port()
        rd = mem.read_port(transparent_for=(wr,))

        head = Signal(ptr_bits)
        tail = Signal(ptr_bits)
        count = Signal(range(self.depth + 1))
        word = Signal(range(TRACE_WORDS))

        pushed = Signal()                                  # push and record, registered
        pushed_record = Signal.like(self.record)
        m.d.sync += [pushed.eq(self.push & ~self.clear), pushed_record.eq(self.record)]

        empty = count == 0
        full = count == self.depth
        do_push = pushed & ~full
        pop = self.read & ~empty & (word == TRACE_WORDS - 1)

        m.d.comb += [
            wr.addr.eq(tail),
            wr.data.eq(pushed_record.as_value()),
            wr.en.eq(do_push),
            # Read the record after the head when popping, so the next record's first
            # word is ready one cycle later.
            rd.addr.eq(head + pop),
            self.level.eq(count),
        ]
        words = Array(rd.data[32 * i:32 * (i + 1)] for i in range(TRACE_WORDS))
        m.d.comb += self.data.eq(words[word] & ~empty.replicate(32))

        with m.If(self.clear):
            m.d.sync += [head.eq(0), tail.eq(0), count.eq(0), word.eq(0), self.dropped.eq(0)]
        with m.Else():
            m.d.sync += [
                tail.eq(tail + do_push),
                head.eq(head + pop),
                count.eq(count + do_push - pop),
            ]
            with m.If(self.read & ~empty):
                m.d.sync += word.eq(word + 1)
                with m.If(word == TRACE_WORDS - 1):
                    m.d.sync += word.eq(0)
            with m.If(pushed & full & (self.dropped != 0xFFFF)):
                m.d.sync += self.dropped.eq(self.dropped + 1)
        return m
