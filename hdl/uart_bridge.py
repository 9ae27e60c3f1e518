"""The UART register bridge: framed requests on a UART line become Wishbone accesses.

The frame formats, constants and CRC are those of :mod:`fusetile.host.uart_protocol`
(``docs/uart.md`` is the specification in prose); the host's serial transport speaks
the same frames.
"""

from contextlib import contextmanager

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..host.uart_protocol import (SYNC_REQ, SYNC_RESP, MAX_WORDS, FRAME_TIMEOUT_BYTES,
                                  Cmd, Status, crc8)
from . import wishbone
from .uart import UartRx, UartTx


__all__ = ["UartBridge", "crc8_next"]


# The CRC is linear over GF(2): the CRC register after one byte is ``T(crc ^ byte)``,
# ``T`` the table of ``uart_protocol.crc8``, and ``T`` of a sum of bits is the XOR of
# ``T`` of each bit. Bit ``j`` of the result is the XOR of the input bits ``i`` whose
# ``T(1 << i)`` has bit ``j`` set.
_CRC_COLUMNS = [crc8([1 << i]) for i in range(8)]


def crc8_next(crc, byte):
    """The CRC-8 register (polynomial 0x07, MSB first) after ``byte``, an 8-bit
    expression: one level of XORs, derived from :func:`uart_protocol.crc8`."""
    x = crc ^ byte
    out = []
    for j in range(8):
        terms = [x[i] for i in range(8) if _CRC_COLUMNS[i] >> j & 1]
        bit = terms[0]
        for t in terms[1:]:
            bit = bit ^ t
        out.append(bit)
    return Cat(*out)


class UartBridge(wiring.Component):
    """Wishbone initiator driven by framed requests on a UART (``docs/uart.md``).

    The bridge receives requests on ``rx``, carries them out on :attr:`bus` and sends
    exactly one response per request on ``tx``. One request is handled at a time:

    * **Hunting.** Bytes other than ``SYNC_REQ`` are ignored. After ``SYNC_REQ`` the
      bridge takes ``CMD``; one that is not a :class:`~uart_protocol.Cmd` is answered
      with ``BAD_COMMAND`` at once (the rest of that frame is hunted through).
    * **Receiving.** ``ADDR`` (3 bytes, little-endian word address), ``COUNT - 1``,
      for a write the ``4 * COUNT`` data bytes (stored in the burst buffer, a
      ``MAX_WORDS`` x 32 :class:`~amaranth.lib.memory.Memory`), then ``CRC``, the CRC-8
      of every byte after ``SYNC_REQ``, computed as the bytes come. If no byte comes
      for ``FRAME_TIMEOUT_BYTES * 10 * divisor`` cycles inside a frame, the frame is
      dropped and answered with ``TIMEOUT``. A wrong ``CRC`` is answered with
      ``BAD_CRC`` and nothing is accessed. A ``COUNT - 1`` of ``MAX_WORDS`` or more
      (no host sends one) is answered with ``BAD_COMMAND`` at once, like a bad ``CMD``.
    * **Executing.** Only after the CRC checks, one Wishbone access per word
      (``cyc``/``stb`` with ``sel = 0b1111``; ``cyc`` and ``stb`` drop for at least one
      cycle between accesses), at consecutive word addresses or, for the ``_FIXED``
      commands, all at ``ADDR``. Each access waits for ``ack`` or ``err``; ``err``, or
      neither within ``timeout_cycles`` cycles (the access is then withdrawn), ends
      the burst with ``BUS_ERROR`` and the word's index as ``ARG``: earlier words were
      accessed, later ones are not. A word whose address does not fit ``addr_width``
      bits (``ADDR`` itself, or a burst that runs past the end of the bus) is not put
      on the bus at all and ends the burst the same way, with ``BUS_ERROR``. Read data
      goes to the burst buffer.
    * **Responding.** ``SYNC_RESP``, ``STATUS``, ``ARG`` (``COUNT - 1`` when OK), the
      data of a successful read (from the buffer, each word little-endian) and the
      CRC-8 of the bytes after ``SYNC_RESP``. The bridge hunts for the next request
      as soon as the response's last byte is handed to the transmitter.

    Bytes that arrive while the bridge executes or responds (before the response's
    last byte is handed on) are dropped; a host waits for the response before sending
    the next request. Every path returns to hunting without a reset.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit on the line, at least 4 (see :class:`UartRx`).
    addr_width : int
        Word address bits of :attr:`bus`.
    timeout_cycles : int
        Cycles an access waits for ``ack`` or ``err`` before the bridge gives up.
    compact : bool
        Built for area (a tile's :attr:`TileConfig.compact`): a write's bytes go to
        their byte lanes of the burst buffer, a read's word to a second buffer in the
        cycle of its ``ack``, and the bus and the response take the words from the
        buffers' read ports: no word registers of their own (two more block RAMs).
        One counter times both the frame's silence and the bus's wait. The same
        frames, in the same cycles on the line and the bus.

    Attributes
    ----------
    rx : In(1)
        The request line, idle high.
    tx : Out(1)
        The response line, idle high.
    bus : Out(wishbone.Signature(addr_width=addr_width))
        The bus the bridge initiates accesses on.

    Raises
    ------
    TypeError
        If a parameter is not an integer.
    ValueError
        If ``divisor`` is less than 4, ``addr_width`` negative or ``timeout_cycles``
        less than 1.
    """

    def __init__(self, divisor, *, addr_width, timeout_cycles=256, compact=False):
        for name, value in (("divisor", divisor), ("addr_width", addr_width),
                            ("timeout_cycles", timeout_cycles)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an integer, not {value!r}")
        if divisor < 4:
            raise ValueError(f"divisor must be at least 4, not {divisor}")
        if addr_width < 0:
            raise ValueError(f"addr_width must be non-negative, not {addr_width}")
        if timeout_cycles < 1:
            raise ValueError(f"timeout_cycles must be at least 1, not {timeout_cycles}")
        self._divisor = divisor
        self._addr_width = addr_width
        self._timeout_cycles = timeout_cycles
        self._compact = bool(compact)
        super().__init__({
            "rx":  In(1, init=1),
            "tx":  Out(1, init=1),
            "bus": Out(wishbone.Signature(addr_width=addr_width)),
        })

    @property
    def divisor(self):
        return self._divisor

    @property
    def addr_width(self):
        return self._addr_width

    @property
    def timeout_cycles(self):
        return self._timeout_cycles

    @property
    def frame_timeout_cycles(self):
        """Cycles of silence inside a frame after which it is dropped."""
        return FRAME_TIMEOUT_BYTES * 10 * self._divisor

    def elaborate(self, platform):
        m = Module()
        aw = self._addr_width
        bus = self.bus

        m.submodules.uart_rx = uart_rx = UartRx(self._divisor, compact=self._compact)
        m.submodules.uart_tx = uart_tx = UartTx(self._divisor)
        m.d.comb += [uart_rx.rx.eq(self.rx), self.tx.eq(uart_tx.tx)]
        got = uart_rx.data.valid
        byte = uart_rx.data.payload
        tx = uart_tx.data

        # The burst buffer: write data as received, read data as the bus returns it.
        m.submodules.buf = buf = Memory(shape=32, depth=MAX_WORDS, init=[])
        compact = self._compact
        # Built for area, a write's bytes go to their lane of the buffer as they come
        # (the block RAM's write mask): no word register assembles them.
        buf_w = buf.write_port(granularity=8 if compact else None)
        buf_r = buf.read_port()         # synchronous: data one cycle after the address
        if compact:
            # Built for area, read data goes to a buffer of its own: each buffer's
            # write data then has one source, not a 32-bit choice of two (32 LUTs of
            # the iCEBreaker's bridge, for 2 of the UP5K's 30 block RAMs).
            m.submodules.read_buf = read_buf = Memory(shape=32, depth=MAX_WORDS,
                                                      init=[])
            read_buf_w = read_buf.write_port()
            read_buf_r = read_buf.read_port()
        # ... and registered in every cycle, so a word takes a cycle more (the *_HOLD
        # states): from the block RAM's output through the word register's choice
        # of its four sources, the UART bridge was 10.62 ns of 7a057ba's ULX3S build
        # (docs/fpga-timing.md, step 40).
        if not compact:
            buf_word = Signal(32, reset_less=True)
            m.d.sync += buf_word.eq(buf_r.data)
        # Both ports are at `idx`, so every write meets a read of its word; no such
        # read is used. The buffer is written only while a request's data comes in and
        # while a read burst runs, and its words are used only while a write burst
        # runs and while the response goes out, which start a byte time (ten bit
        # times) or more after the last write, each reading its words afresh: the
        # iCE40 build declares the read's collisions undefined
        # (`fusetile.host.fpga.ice40_collision_free`).

        cmd = Signal(8)
        is_write = cmd[1]               # WRITE, WRITE_FIXED
        fixed = cmd[4]                  # READ_FIXED, WRITE_FIXED
        if compact:
            # The bus's word address and, above it, whether it has left the bus: set by
            # ADDR bits beyond ``aw`` as they come, or by a burst's carry.
            addr = Signal(aw + 1)
            out_of_range = addr[aw]
        else:
            # The word address of the current access. 24 bits from the frame plus a
            # carry (a burst may run past 2**24); wide enough for a bus of more than
            # 24 bits.
            addr = Signal(max(aw, 24) + 1)
            out_of_range = addr[aw:] != 0
        last = Signal(range(MAX_WORDS))     # COUNT - 1
        idx = Signal(range(MAX_WORDS))      # word of the burst
        nbyte = Signal(2)                   # byte of the word (ADDR: byte of ADDR)
        status = Signal(8)
        rx_crc = Signal(8)
        tx_crc = Signal(8)
        arg = Signal(8)
        if compact:
            # No word register: a write's bytes go to their lanes of the buffer, the
            # bus's write data and the response's bytes come from the read ports.
            # The silence inside a frame and a bus access's wait are never timed at
            # once: one counter for both.
            word = None
            frame_timer = bus_timer = Signal(range(max(self.frame_timeout_cycles,
                                                       self._timeout_cycles)))
        else:
            word = Signal(32)               # write word being assembled
            frame_timer = Signal(range(self.frame_timeout_cycles))
            bus_timer = Signal(range(self._timeout_cycles))

        def reached(timer, limit):
            # ``timer == limit``. Built for area, the limit's one bits alone: the
            # timer counts up from 0 and stops at the limit it is compared with.
            if compact:
                return Cat(timer[i] for i in range(len(timer)) if limit >> i & 1).all()
            return timer == limit

        # `cyc` and `stb` are a register of their own, not a decode of the state: they
        # reach every block on the tile's bus (from the state's decode they were on
        # the ULX3S build's worst path, step 35). The bus's answer is registered in
        # each cycle of the access: EXEC_ANSWER takes the one of its last cycle.
        strobe = Signal()
        answer_ack = Signal()
        answer_err = Signal()
        # Built for area, a read's word goes into the burst buffer as it comes (with
        # `ack`; an access that fails leaves no word a response sends): no register.
        answer_data = None if self._compact else Signal(32)
        with m.If(strobe):
            m.d.sync += [answer_ack.eq(bus.ack), answer_err.eq(bus.err)]
            if answer_data is None:
                with m.If(bus.ack & ~is_write):
                    m.d.comb += read_buf_w.en.eq(1)
            else:
                m.d.sync += answer_data.eq(bus.dat_r)

        m.d.comb += [
            bus.cyc.eq(strobe),
            bus.stb.eq(strobe),
            buf_r.addr.eq(idx),
            buf_w.addr.eq(idx),
            bus.adr.eq(addr[:aw]),
            bus.we.eq(is_write),
            # The burst buffer's words go out from a register (EXEC_LOAD, RESP_LOAD),
            # not from the block RAM's output: its clock-to-output is most of a cycle
            # on the ULX3S (docs/fpga-timing.md, step 28). Built for area, from the
            # read port, which holds word `idx` from EXEC_FETCH on.
            bus.dat_w.eq(buf_r.data if compact else word),
            bus.sel.eq(0b1111),
        ]
        if compact:
            m.d.comb += [
                buf_w.data.eq(Cat(byte, byte, byte, byte)),
                read_buf_r.addr.eq(idx),
                read_buf_w.addr.eq(idx),
                read_buf_w.data.eq(bus.dat_r),
            ]

        if compact:
            # ADDR's byte or the burst's next address, `fill`, is chosen by `loading`,
            # which is also the adder's other operand (all ones, a sum not taken):
            # Yosys then puts the choice in the LUT of each bit's carry cell, one LUT a
            # bit, not a LUT for the sum and one for the choice (17 LUTs for the
            # iCEBreaker's 19-bit bus address, mapped alone).
            loading = Signal()
            step = addr[:aw] + Cat(~fixed | loading, loading.replicate(max(0, aw - 1)))
            fill = Mux(loading, Cat(byte, byte, byte, C(0, max(0, aw - 24)))[:aw],
                       step[:aw])

        def respond(code, argument=0):
            m.d.sync += [status.eq(code), arg.eq(argument)]
            m.next = "RESP_SYNC"

        def take():
            # A byte of the frame arrived: restart the silence timer, CRC it.
            m.d.sync += [frame_timer.eq(0), rx_crc.eq(crc8_next(rx_crc, byte))]

        def silence():
            # No byte this cycle, inside a frame.
            with m.If(reached(frame_timer, self.frame_timeout_cycles - 1)):
                respond(Status.TIMEOUT)
            with m.Else():
                m.d.sync += frame_timer.eq(frame_timer + 1)

        if compact:
            # The transmitter's byte comes from a register, `out`, that follows the
            # state's byte a cycle behind and holds SYNC_RESP outside the response:
            # the CRC takes the register, not the choice of five sources in front of
            # it (32 LUTs fewer in the bridge). The transmitter takes no byte in a
            # state's first cycle: it still sends the last one, or `out` is SYNC_RESP
            # already. Nor in the two cycles after RESP_DATA moves on to a word.
            out = Signal(8, init=SYNC_RESP)
            m.d.comb += tx.payload.eq(out)
            m.d.sync += out.eq(SYNC_RESP)

        def offer(payload):
            # Offer a response byte to the transmitter.
            if compact:
                m.d.comb += tx.valid.eq(1)
                m.d.sync += out.eq(payload)
            else:
                m.d.comb += [tx.valid.eq(1), tx.payload.eq(payload)]

        @contextmanager
        def send(payload):
            # Offer a response byte after SYNC_RESP to the transmitter; CRC it and run
            # the body in the cycle it is taken.
            offer(payload)
            with m.If(tx.ready):
                m.d.sync += tx_crc.eq(crc8_next(tx_crc, out if compact else payload))
                yield

        with m.FSM(name="bridge_fsm"):
            # -- request ---------------------------------------------------------------
            with m.State("HUNT"):
                with m.If(got & (byte == SYNC_REQ)):
                    m.d.sync += [frame_timer.eq(0), rx_crc.eq(0)]
                    m.next = "CMD"

            with m.State("CMD"):
                with m.If(got):
                    take()
                    m.d.sync += [cmd.eq(byte), nbyte.eq(0)]
                    with m.Switch(byte):
                        with m.Case(*(c.value for c in Cmd)):
                            m.next = "ADDR"
                        with m.Default():
                            respond(Status.BAD_COMMAND)
                with m.Else():
                    silence()

            with m.State("ADDR"):
                with m.If(got):
                    take()
                    m.d.sync += nbyte.eq(nbyte + 1)
                    if compact:
                        # Each byte to its place; the bits of it beyond the bus set
                        # addr[aw] (its first byte clears what the last frame left).
                        m.d.comb += loading.eq(1)
                        with m.Switch(nbyte):
                            for k in range(3):
                                with m.Case(k):
                                    lo = 8 * k
                                    if lo < aw:
                                        hi = min(lo + 8, aw)
                                        m.d.sync += addr[lo:hi].eq(fill[lo:hi])
                                    if k == 0 and aw > 24:
                                        m.d.sync += addr[24:aw].eq(0)
                                    beyond = (byte[max(0, aw - lo):].any()
                                              if aw < lo + 8 else 0)
                                    m.d.sync += addr[aw].eq(addr[aw] | beyond if k
                                                            else beyond)
                    else:
                        # Little-endian: each byte comes in at the top of the 24 bits.
                        m.d.sync += addr.eq(Cat(addr[8:24], byte))
                    with m.If(nbyte == 2):
                        m.next = "COUNT"
                with m.Else():
                    silence()

            with m.State("COUNT"):
                with m.If(got):
                    take()
                    m.d.sync += [last.eq(byte), idx.eq(0), nbyte.eq(0)]
                    with m.If(byte >= MAX_WORDS):
                        # Not a valid frame (the host never sends it); the CRC may
                        # still check, so refuse it as a bad command, like a bad CMD.
                        respond(Status.BAD_COMMAND)
                    with m.Elif(is_write):
                        m.next = "DATA"
                    with m.Else():
                        m.next = "CRC"
                with m.Else():
                    silence()

            with m.State("DATA"):
                with m.If(got):
                    take()
                    m.d.sync += nbyte.eq(nbyte + 1)
                    if compact:
                        m.d.comb += buf_w.en.eq(1 << nbyte)     # little-endian
                    else:
                        full = Cat(word[8:], byte)      # little-endian, like ADDR
                        m.d.sync += word.eq(full)
                    with m.If(nbyte == 3):
                        if not compact:
                            m.d.comb += [buf_w.en.eq(1), buf_w.data.eq(full)]
                        m.d.sync += idx.eq(idx + 1)
                        with m.If(idx == last):
                            m.next = "CRC"
                with m.Else():
                    silence()

            with m.State("CRC"):
                with m.If(got):
                    take()
                    m.d.sync += idx.eq(0)
                    with m.If(byte != rx_crc):
                        respond(Status.BAD_CRC)
                    with m.Else():
                        m.next = "EXEC_FETCH"
                with m.Else():
                    silence()

            # -- burst -----------------------------------------------------------------
            with m.State("EXEC_FETCH"):
                # buf_r reads word ``idx`` (write data) for the access that follows.
                m.d.sync += bus_timer.eq(0)
                with m.If(out_of_range):
                    respond(Status.BUS_ERROR, idx)
                with m.Else():
                    m.next = "EXEC_HOLD"

            with m.State("EXEC_HOLD"):
                m.next = "EXEC_LOAD"

            with m.State("EXEC_LOAD"):
                m.d.sync += strobe.eq(1)
                if not compact:
                    m.d.sync += word.eq(buf_word)
                m.next = "EXEC_WAIT"

            with m.State("EXEC_WAIT"):
                # The bus's answer only ends the access (`strobe` falls); a cycle
                # later the state moves on, and EXEC_ANSWER acts on the answer, all
                # from registers. Everything the answer decided at once (the state,
                # the status, the buffer, the index and address) was the UART
                # bridge's share of the ULX3S build's late endpoints (step 35).
                m.d.sync += bus_timer.eq(bus_timer + 1)
                with m.If(strobe):
                    with m.If(bus.ack | bus.err |
                              reached(bus_timer, self._timeout_cycles - 1)):
                        m.d.sync += strobe.eq(0)
                with m.Else():
                    m.next = "EXEC_ANSWER"

            with m.State("EXEC_ANSWER"):
                with m.If(answer_err | ~answer_ack):    # an error, or no answer in time
                    respond(Status.BUS_ERROR, idx)
                with m.Else():
                    if answer_data is not None:
                        with m.If(~is_write):
                            m.d.comb += [buf_w.en.eq(1), buf_w.data.eq(answer_data)]
                    with m.If(idx == last):
                        m.d.sync += idx.eq(0)
                        respond(Status.OK, last)
                    with m.Else():
                        m.d.sync += idx.eq(idx + 1)
                        if compact:
                            m.d.sync += addr.eq(Cat(fill, step[aw]))
                        else:
                            m.d.sync += addr.eq(addr + ~fixed)
                        m.next = "EXEC_FETCH"

            # -- response --------------------------------------------------------------
            with m.State("RESP_SYNC"):
                offer(SYNC_RESP)
                m.d.sync += tx_crc.eq(0)
                with m.If(tx.ready):
                    m.next = "RESP_STATUS"

            with m.State("RESP_STATUS"):
                with send(status):
                    m.next = "RESP_ARG"

            with m.State("RESP_ARG"):
                with send(arg):
                    m.d.sync += nbyte.eq(0)     # idx is 0 after a successful burst
                    with m.If((status == Status.OK) & ~is_write):
                        m.next = "RESP_DATA" if compact else "RESP_FETCH"
                    with m.Else():
                        m.next = "RESP_CRC"

            if compact:
                with m.State("RESP_DATA"):
                    # Little-endian, from the read port, which follows `idx` a cycle
                    # behind (and `out` another): the transmitter takes the next byte
                    # a byte time after the last one, so no FETCH, HOLD or LOAD
                    # states, and the line sees the same bytes at the same times.
                    with send(read_buf_r.data.word_select(nbyte, 8)):
                        m.d.sync += nbyte.eq(nbyte + 1)
                        with m.If(nbyte == 3):
                            m.d.sync += idx.eq(idx + 1)
                            with m.If(idx == last):
                                m.next = "RESP_CRC"
            else:
                with m.State("RESP_FETCH"):
                    # buf_r reads word ``idx``; RESP_HOLD registers it, RESP_LOAD
                    # takes it.
                    m.next = "RESP_HOLD"

                with m.State("RESP_HOLD"):
                    m.next = "RESP_LOAD"

                with m.State("RESP_LOAD"):
                    m.d.sync += word.eq(buf_word)
                    m.next = "RESP_DATA"

                with m.State("RESP_DATA"):
                    # Little-endian: the word shifts down a byte per byte sent.
                    with send(word[:8]):
                        m.d.sync += [word.eq(word[8:]), nbyte.eq(nbyte + 1)]
                        with m.If(nbyte == 3):
                            m.d.sync += idx.eq(idx + 1)
                            with m.If(idx == last):
                                m.next = "RESP_CRC"
                            with m.Else():
                                m.next = "RESP_FETCH"

            with m.State("RESP_CRC"):
                offer(tx_crc)
                with m.If(tx.ready):
                    m.next = "HUNT"

        return m
