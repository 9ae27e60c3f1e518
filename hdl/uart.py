"""A UART: 8 data bits, no parity, 1 stop bit, least significant bit first.

The bit time is a whole number of clock cycles, ``divisor`` (the clock frequency
divided by the baud rate). The byte side of both directions is an
:mod:`amaranth.lib.stream`; the line is idle high.
"""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out


__all__ = ["UartRx", "UartTx"]


def _check_divisor(divisor, minimum):
    if not isinstance(divisor, int) or isinstance(divisor, bool):
        raise TypeError(f"divisor must be an integer, not {divisor!r}")
    if divisor < minimum:
        raise ValueError(f"divisor must be at least {minimum}, not {divisor}")


class UartRx(wiring.Component):
    """UART receiver, 8N1, least significant bit first.

    The ``rx`` pin goes through a two-flop synchroniser. A falling edge of the
    synchronised line (high, then low) while idle starts a byte; the start bit is
    sampled half a bit time (``divisor // 2`` cycles) later and, if it is high again
    (a glitch), the receiver goes back to idle. Otherwise the 8 data bits and the stop
    bit are sampled every ``divisor`` cycles from there, in the middle of each bit.

    A stop bit sampled high delivers the byte on :attr:`data`; a stop bit sampled low
    drops the byte and pulses :attr:`frame_error`. Either way the receiver is idle
    again from the middle of the stop bit and waits for the next falling edge, so a
    line held low (a break) gives one framing error, not a stream of zero bytes.

    Stream convention: :attr:`data` is ``always_ready``: ``valid`` is high for exactly
    one cycle per received byte, with the byte on ``payload`` in that cycle, and there
    is no back-pressure: the consumer must take it then. ``payload`` holds the last
    byte until the next one is received (``compact``: until the next byte's first data
    bit is sampled).

    Parameters
    ----------
    divisor : int
        Clock cycles per bit, at least 4.
    compact : bool
        Built for area: ``payload`` is the shift register the bits come into, no
        register of its own (8 flip-flops, each a logic cell of an iCE40 as it is
        loaded from another flip-flop).

    Attributes
    ----------
    rx : In(1)
        The line (idle high), asynchronous to the clock.
    data : Out(stream.Signature(8, always_ready=True))
        Received bytes.
    frame_error : Out(1)
        Pulses for one cycle when a byte's stop bit was low (the byte is dropped).

    Raises
    ------
    TypeError
        If ``divisor`` is not an integer.
    ValueError
        If ``divisor`` is less than 4.
    """

    def __init__(self, divisor, *, compact=False):
        _check_divisor(divisor, 4)
        self._divisor = divisor
        self._compact = bool(compact)
        super().__init__({
            "rx":          In(1, init=1),
            "data":        Out(stream.Signature(8, always_ready=True)),
            "frame_error": Out(1),
        })

    @property
    def divisor(self):
        return self._divisor

    def elaborate(self, platform):
        m = Module()
        divisor = self._divisor

        line = Signal(init=1)           # synchronised rx
        prev = Signal(init=1)           # line, one cycle earlier
        m.submodules.sync = FFSynchronizer(self.rx, line, init=1, stages=2)
        m.d.sync += prev.eq(line)

        timer = Signal(range(divisor))  # cycles to the next sample, minus one
        bits = Signal(3)                # data bits received so far (mod 8)
        shreg = Signal(8)

        m.d.sync += [self.data.valid.eq(0), self.frame_error.eq(0)]
        if self._compact:
            m.d.comb += self.data.payload.eq(shreg)

        with m.FSM(name="rx_fsm"):
            with m.State("IDLE"):
                with m.If(prev & ~line):
                    m.d.sync += timer.eq(divisor // 2 - 1)
                    m.next = "START"

            with m.State("START"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(line):
                    m.next = "IDLE"             # not low at mid-bit: a glitch
                with m.Else():
                    m.d.sync += [timer.eq(divisor - 1), bits.eq(0)]
                    m.next = "DATA"

            with m.State("DATA"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Else():
                    m.d.sync += [
                        shreg.eq(Cat(shreg[1:], line)),     # LSB first
                        bits.eq(bits + 1),
                        timer.eq(divisor - 1),
                    ]
                    with m.If(bits == 7):
                        m.next = "STOP"

            with m.State("STOP"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Else():
                    with m.If(line):
                        m.d.sync += self.data.valid.eq(1)
                        if not self._compact:
                            m.d.sync += self.data.payload.eq(shreg)
                    with m.Else():
                        m.d.sync += self.frame_error.eq(1)
                    m.next = "IDLE"

        return m


class UartTx(wiring.Component):
    """UART transmitter, 8N1, least significant bit first.

    :attr:`data` is ready while the transmitter is idle and in the last cycle of a stop
    bit. A byte taken in cycle ``t`` is sent from cycle ``t + 1``: the start bit, 8
    data bits and the stop bit, each ``divisor`` cycles long; a byte offered while the
    previous one is sent is taken in the last cycle of its stop bit, so back-to-back
    bytes follow each other with no idle time between them.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit, at least 1.

    Attributes
    ----------
    data : In(stream.Signature(8))
        Bytes to send.
    tx : Out(1)
        The line, idle high (registered).

    Raises
    ------
    TypeError
        If ``divisor`` is not an integer.
    ValueError
        If ``divisor`` is less than 1.
    """

    def __init__(self, divisor):
        _check_divisor(divisor, 1)
        self._divisor = divisor
        super().__init__({
            "data": In(stream.Signature(8)),
            "tx":   Out(1, init=1),
        })

    @property
    def divisor(self):
        return self._divisor

    def elaborate(self, platform):
        m = Module()
        divisor = self._divisor

        busy = Signal()
        timer = Signal(range(divisor))
        bits = Signal(range(10))        # bits left to send after the current one
        shreg = Signal(9)               # data bits then the stop bit, sent LSB first

        last = Signal()                 # the last cycle of the stop bit
        m.d.comb += [
            last.eq(busy & (timer == 0) & (bits == 0)),
            self.data.ready.eq(~busy | last),
        ]

        with m.If(self.data.valid & self.data.ready):
            m.d.sync += [
                busy.eq(1),
                self.tx.eq(0),                                  # start bit
                shreg.eq(Cat(self.data.payload, 1)),
                bits.eq(9),
                timer.eq(divisor - 1),
            ]
        with m.Elif(last):
            m.d.sync += busy.eq(0)                              # tx stays high (idle)
        with m.Elif(busy & (timer != 0)):
            m.d.sync += timer.eq(timer - 1)
        with m.Elif(busy):
            m.d.sync += [
                self.tx.eq(shreg[0]),
                shreg.eq(shreg[1:]),
                bits.eq(bits - 1),
                timer.eq(divisor - 1),
            ]

        return m
