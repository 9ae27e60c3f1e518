"""The DMA command queue with dependency tokens."""

from amaranth.hdl import Module, Signal, ResetInserter
from amaranth.lib import wiring, data, stream
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..kernels.config import TileConfig
from ..kernels.isa import DMA_TOKENS
from .dma import DmaCommand


__all__ = ["QueuedDmaCommand", "DmaQueue"]


class QueuedDmaCommand(data.Struct):
    command: DmaCommand
    token: range(DMA_TOKENS)


class DmaQueue(wiring.Component):
    """Decouples the kernel sequencer from the DMA engine, as VTA's command queues do.

    The sequencer pushes commands tagged with a token and goes on (to a MATMUL, say)
    while the engine works through them in order; WAIT then waits only for the tokens
    it names, so a kernel can load the next tile while it computes on this one.

    Parameters
    ----------
    config : TileConfig
        ``dma_queue`` sets the depth. With 1 the queue is one register
        (:class:`~amaranth.lib.fifo.SyncFIFOBuffered`'s own case): a command is
        offered to the engine the cycle after its push, and the next push waits
        until the engine has taken it. With 0 there is no queue, only the tokens: a
        push is the engine's command, taken in its cycle when the engine is ready
        (and not in a flush's), and waits otherwise.

    Attributes
    ----------
    push : In(stream.Signature(QueuedDmaCommand))
    cmd : Out(stream.Signature(DmaCommand))
        To the DMA engine.
    engine_busy : In(1)
        The engine's ``busy``; a command the engine accepted is complete when it drops.
    outstanding : Out(DMA_TOKENS)
        Bit t: a command tagged t is queued or in the engine.
    idle : Out(1)
        Nothing queued, nothing in the engine.
    flush : In(1)
        Drop every queued command and forget the one in the engine (the engine is
        aborted alongside). With a queue ``cmd.valid`` does not wait for it: the
        engine drops a command it takes in a flush's cycle, being aborted.
    """

    def __init__(self, config):
        if not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig, not {config!r}")
        self.config = config
        super().__init__({
            "push": In(stream.Signature(QueuedDmaCommand)),
            "cmd": Out(stream.Signature(DmaCommand)),
            "engine_busy": In(1),
            "outstanding": Out(DMA_TOKENS),
            "idle": Out(1),
            "flush": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        depth = self.config.dma_queue

        counts = [Signal(range(depth + 2), name=f"tok{t}") for t in range(DMA_TOKENS)]
        in_engine = Signal()
        engine_token = Signal(range(DMA_TOKENS))

        if depth:
            width = QueuedDmaCommand.as_shape().size
            fifo = SyncFIFOBuffered(width=width, depth=depth)
            # The FIFO has no clear input: flushing resets it.
            m.submodules.fifo = ResetInserter(self.flush)(fifo)
            head = QueuedDmaCommand(fifo.r_data)
            m.d.comb += [
                fifo.w_data.eq(self.push.payload),
                fifo.w_en.eq(self.push.valid & ~self.flush),
                self.push.ready.eq(fifo.w_rdy & ~self.flush),
                self.cmd.payload.eq(head.command),
                self.cmd.valid.eq(fifo.r_rdy),
                fifo.r_en.eq(self.cmd.ready),
            ]
        else:
            # No queue: the push goes straight to the engine (whose `cmd.ready` is
            # its idle, unfaulted registers), so pushed and issued are one.
            head = self.push.payload
            m.d.comb += [
                self.push.ready.eq(self.cmd.ready & ~self.flush),
                self.cmd.payload.eq(head.command),
                self.cmd.valid.eq(self.push.valid & ~self.flush),
            ]
        pushed = self.push.valid & self.push.ready
        issued = self.cmd.valid & self.cmd.ready
        completed = in_engine & ~self.engine_busy

        # Each token's `outstanding` bit is a register beside its count, set from the
        # count's next value, rather than the count compared with zero: RET waits for
        # every bit and WAIT for the ones it names, and the comparison came first on
        # the fault decision's worst paths (RET's return past the bank; 11.38 ns of
        # 7a057ba's ULX3S build, docs/fpga-timing.md step 40).
        for t, count in enumerate(counts):
            inc = pushed & (self.push.payload.token == t)
            dec = completed & (engine_token == t)
            with m.If(self.flush):
                m.d.sync += [count.eq(0), self.outstanding[t].eq(0)]
            with m.Else():
                m.d.sync += [count.eq(count + inc - dec),
                             self.outstanding[t].eq(inc | (count != 0) &
                                                    ~(dec & (count == 1)))]

        with m.If(self.flush):
            m.d.sync += in_engine.eq(0)
        with m.Elif(issued):
            m.d.sync += [in_engine.eq(1), engine_token.eq(head.token)]
        with m.Elif(completed):
            m.d.sync += in_engine.eq(0)

        m.d.comb += self.idle.eq(self.outstanding == 0)
        return m
