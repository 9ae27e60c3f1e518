"""Wishbone B4 classic, 32-bit: the tile's register interface.

Only the signals the tile uses: CYC, STB, WE, ADR (word address), DAT_W, DAT_R, SEL,
ACK, ERR. Every access is answered by exactly one of ACK or ERR, one or more cycles
after STB; an access nobody decodes is answered with ERR.

:class:`Decoder` splits one bus into address windows, one sub-bus each.
"""

import re

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


__all__ = ["Signature", "Decoder"]


class Signature(wiring.Signature):
    """Wishbone B4 classic bus, from the initiator's point of view.

    Parameters
    ----------
    addr_width : int
        Width of ``adr``, a *word* address (byte address >> 2).
    data_width : int
        Width of ``dat_w`` / ``dat_r``; only 32 is supported.

    Members
    -------
    cyc, stb, we : Out(1)
    adr : Out(addr_width)
    dat_w : Out(32)
    dat_r : In(32)
    sel : Out(4)
        Byte lanes of a write.
    ack, err : In(1)
    """

    def __init__(self, *, addr_width, data_width=32):
        if not isinstance(addr_width, int) or addr_width < 0:
            raise TypeError(f"addr_width must be a non-negative integer, not {addr_width!r}")
        if data_width != 32:
            raise ValueError(f"data_width must be 32, not {data_width!r}")
        self.addr_width = addr_width
        self.data_width = data_width
        super().__init__({
            "cyc":   Out(1),
            "stb":   Out(1),
            "we":    Out(1),
            "adr":   Out(addr_width),
            "dat_w": Out(data_width),
            "dat_r": In(data_width),
            "sel":   Out(data_width // 8),
            "ack":   In(1),
            "err":   In(1),
        })

    def __eq__(self, other):
        return (isinstance(other, Signature) and self.addr_width == other.addr_width
                and self.data_width == other.data_width)

    def __repr__(self):
        return f"wishbone.Signature(addr_width={self.addr_width}, data_width={self.data_width})"


class Decoder(wiring.Component):
    """Route a Wishbone bus to address windows, one sub-bus per window.

    Windows are declared with :meth:`add` before the decoder is elaborated; the parent
    then connects each window's sub-bus (:meth:`sub`) to a slave::

        dec = Decoder(addr_width=19)
        dec.add("csr", addr=0x0, size=0x1000)    # byte address and size
        m.submodules.dec = dec
        wiring.connect(m, wiring.flipped(self.bus), dec.bus)
        wiring.connect(m, dec.sub("csr"), csr_bank.bus)

    A sub-bus's ``adr`` is the word address relative to its window, so a window of
    ``size`` bytes has a sub-bus of ``log2(size // 4)`` address bits. The selected
    slave sees ``cyc``/``stb`` in the same cycle as the decoder (no added latency) and
    its ``ack``/``err``/``dat_r`` go straight back. An access that hits no window is
    answered by the decoder itself with ``err``, one cycle later.

    Parameters
    ----------
    addr_width : int
        Word address bits of :attr:`bus`.

    Attributes
    ----------
    bus : In(Signature(addr_width=addr_width))
        The decoded bus.

    Raises
    ------
    TypeError
        If ``addr_width`` is not a non-negative integer.
    """

    def __init__(self, *, addr_width):
        if not isinstance(addr_width, int) or isinstance(addr_width, bool) or addr_width < 0:
            raise TypeError(f"addr_width must be a non-negative integer, not {addr_width!r}")
        self._addr_width = addr_width
        self._windows = {}      # name -> (byte addr, byte size, sub-bus interface)
        self._frozen = False
        super().__init__({"bus": In(Signature(addr_width=addr_width))})

    def add(self, name, *, addr, size):
        """Add the window ``[addr, addr + size)`` (bytes) and return its sub-bus signature.

        Parameters
        ----------
        name : str
            Name of the window, used with :meth:`sub`.
        addr : int
            Byte address of the window, a multiple of ``size``.
        size : int
            Bytes of the window, a power of two, at least 4.

        Returns
        -------
        Signature
            Signature of the window's sub-bus, ``addr_width = log2(size // 4)``
            (initiator view: the slave's port is ``In(...)`` of it).

        Raises
        ------
        TypeError
            If ``name`` is not a string or ``addr``/``size`` are not integers.
        ValueError
            If the name is taken, ``size`` is not a power of two >= 4, ``addr`` is not
            aligned to ``size``, the window does not fit the bus, or it overlaps another.
        RuntimeError
            If the decoder has already been elaborated.
        """
        if self._frozen:
            raise RuntimeError(f"Cannot add window {name!r}: the decoder is already elaborated")
        if not isinstance(name, str):
            raise TypeError(f"Window name must be a string, not {name!r}")
        if name in self._windows:
            raise ValueError(f"Window name {name!r} is already used")
        for arg, value in (("addr", addr), ("size", size)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"Window {arg} must be an integer, not {value!r}")
        if size < 4 or size & (size - 1):
            raise ValueError(f"Window size must be a power of two of at least 4, not {size:#x}")
        if addr < 0 or addr % size:
            raise ValueError(f"Window address must be a multiple of its size {size:#x}, "
                             f"not {addr:#x}")
        if addr + size > 4 << self._addr_width:
            raise ValueError(f"Window {name!r} at {addr:#x} + {size:#x} does not fit the "
                             f"{4 << self._addr_width:#x}-byte bus")
        for other, (o_addr, o_size, _) in self._windows.items():
            if addr < o_addr + o_size and o_addr < addr + size:
                raise ValueError(f"Window {name!r} at {addr:#x} overlaps window {other!r} "
                                 f"at {o_addr:#x}")
        sig = Signature(addr_width=(size // 4).bit_length() - 1)
        path = ("sub_" + re.sub(r"\W", "_", name),)
        self._windows[name] = (addr, size, sig.create(path=path))
        return sig

    def sub(self, name):
        """The sub-bus interface of window ``name`` (connect it to the slave's bus).

        Raises
        ------
        KeyError
            If there is no window named ``name``.
        """
        try:
            return self._windows[name][2]
        except KeyError:
            raise KeyError(f"Decoder has no window named {name!r}") from None

    @property
    def windows(self):
        """``{name: (byte addr, byte size)}`` of the windows, in the order added."""
        return {name: (addr, size) for name, (addr, size, _) in self._windows.items()}

    def elaborate(self, platform):
        self._frozen = True
        m = Module()
        bus = self.bus

        # The decoder answers a miss itself; ``miss_err`` is that answer, and masks the
        # access while it is on the bus so that it is answered only once.
        miss_err = Signal()
        sub_ack, sub_err = Signal(), Signal()
        m.d.sync += miss_err.eq(0)
        m.d.comb += [bus.ack.eq(sub_ack), bus.err.eq(sub_err | miss_err)]

        with m.Switch(bus.adr):
            for addr, size, sub in self._windows.values():
                width = sub.signature.addr_width
                # The window's upper address bits, then don't-cares for its offset.
                prefix = format(addr >> 2 >> width, f"0{self._addr_width - width}b") \
                    if self._addr_width > width else ""
                with m.Case(prefix + "-" * width):
                    m.d.comb += [
                        sub.cyc.eq(bus.cyc),
                        sub.stb.eq(bus.stb),
                        sub_ack.eq(sub.ack),
                        sub_err.eq(sub.err),
                        bus.dat_r.eq(sub.dat_r),
                    ]
            with m.Default():
                with m.If(bus.cyc & bus.stb & ~miss_err):
                    m.d.sync += miss_err.eq(1)

        for _, _, sub in self._windows.values():
            width = sub.signature.addr_width
            m.d.comb += [
                sub.we.eq(bus.we),
                sub.adr.eq(bus.adr[:width]),
                sub.dat_w.eq(bus.dat_w),
                sub.sel.eq(bus.sel),
            ]
        return m
