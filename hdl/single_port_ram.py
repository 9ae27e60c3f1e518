"""A single-port RAM: in the iCE40UP's SPRAM when built for one, a memory otherwise.

The iCE40UP5K has four SB_SPRAM256KA blocks of 16K x 16 bits (128 KiB, four times its
30 block RAMs together) with one port each. Yosys infers them (``synth_ice40
-spram``) only for memories without initial contents, and an Amaranth memory always
has some (zeros by default), so :class:`SinglePortRam` instantiates them itself, as
LiteX's ``Up5kSPRAM`` does. Built for anything else (the simulators, the ECP5), it is
an Amaranth memory with the same behaviour, which Yosys maps to block RAM.
"""

from amaranth.hdl import Cat, ClockSignal, Const, Instance, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.vendor import SiliconBluePlatform


__all__ = ["SPRAM_WORDS", "SPRAM_BITS", "SPRAM_BLOCKS", "SinglePortRam", "check_spram",
           "spram_blocks", "uses_spram"]


SPRAM_WORDS = 16384     #: words of one SB_SPRAM256KA
SPRAM_BITS = 16         #: bits of a word of one SB_SPRAM256KA
SPRAM_BLOCKS = 4        #: SB_SPRAM256KA blocks of an iCE40UP5K


def spram_blocks(width, depth):
    """SB_SPRAM256KA blocks ``depth`` words of ``width`` bits take: 16-bit slices side
    by side, 16K-word banks one above the other."""
    return (width // SPRAM_BITS) * -(-depth // SPRAM_WORDS)


def check_spram(width, depth, device):
    """Raise ``ValueError`` if ``depth`` words of ``width`` bits need more SPRAM
    blocks than an iCE40UP (``device``, for the message) has."""
    if spram_blocks(width, depth) > SPRAM_BLOCKS:
        raise ValueError(f"{depth} words of {width} bits need {spram_blocks(width, depth)} "
                         f"SPRAM blocks; {device} has {SPRAM_BLOCKS}")


def uses_spram(platform):
    """Whether :class:`SinglePortRam` is built in SPRAM for ``platform`` (an iCE40UP)."""
    return isinstance(platform, SiliconBluePlatform) and platform.device.startswith("iCE40UP")


class SinglePortRam(wiring.Component):
    """``depth`` words of ``width`` bits (a multiple of 16) behind one port: a cycle
    reads a word or writes bytes of one, at ``addr``.

    A read (``re``, no bit of ``we``) puts the word on ``rdata`` in the next cycle;
    ``rdata`` holds through idle cycles until the next read or write (after a write it
    is undefined: Yosys' model of the cell makes it X). ``re`` together with a write is
    a write. In SPRAM the contents are undefined after configuration (the memory's
    are zeros).

    Parameters
    ----------
    width : int
        Bits per word, a multiple of 16.
    depth : int
        Words.

    Attributes
    ----------
    addr : In(range(depth))
    re : In(1)
    we : In(width // 8)
        Byte write enables.
    wdata : In(width)
    rdata : Out(width)

    Raises
    ------
    ValueError
        If ``width`` is not a positive multiple of 16, or ``depth`` is not positive.
        On elaboration for an iCE40UP, if it needs more SPRAM blocks than there are.
    """

    def __init__(self, width, depth):
        if not isinstance(width, int) or width <= 0 or width % SPRAM_BITS:
            raise ValueError(f"width must be a positive multiple of {SPRAM_BITS}, "
                             f"not {width!r}")
        if not isinstance(depth, int) or depth <= 0:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self.width = width
        self.depth = depth
        super().__init__({
            "addr":  In(range(depth)),
            "re":    In(1),
            "we":    In(width // 8),
            "wdata": In(width),
            "rdata": Out(width),
        })

    def elaborate(self, platform):
        in_spram = uses_spram(platform)
        if in_spram:
            check_spram(self.width, self.depth, platform.device)
        m = Module()
        write = self.we.any()
        if not in_spram:
            m.submodules.mem = mem = Memory(shape=self.width, depth=self.depth, init=[])
            w = mem.write_port(granularity=8)
            r = mem.read_port()
            m.d.comb += [
                w.addr.eq(self.addr), w.data.eq(self.wdata), w.en.eq(self.we),
                r.addr.eq(self.addr), r.en.eq(self.re & ~write), self.rdata.eq(r.data),
            ]
            return m

        banks = -(-self.depth // SPRAM_WORDS)
        bank = self.addr[14:] if banks > 1 else Const(0)
        read_bank = Signal(range(banks))        # the bank of the last read: rdata's
        with m.If(self.re & ~write):
            m.d.sync += read_bank.eq(bank)
        outputs = []
        for b in range(banks):
            here = bank == b
            words = []
            for s in range(self.width // SPRAM_BITS):
                out = Signal(SPRAM_BITS, name=f"spram{b}_{s}")
                # MASKWREN is per nibble: two for each byte enable.
                nibbles = Cat(self.we[2 * s], self.we[2 * s], self.we[2 * s + 1],
                              self.we[2 * s + 1])
                m.submodules[f"spram{b}_{s}"] = Instance(
                    "SB_SPRAM256KA",
                    i_ADDRESS=self.addr[:14],
                    i_DATAIN=self.wdata[SPRAM_BITS * s:SPRAM_BITS * (s + 1)],
                    i_MASKWREN=nibbles,
                    i_WREN=write & here,
                    i_CHIPSELECT=(self.re | write) & here,
                    i_CLOCK=ClockSignal(),
                    i_STANDBY=0,
                    i_SLEEP=0,
                    i_POWEROFF=1,           # active low: powered
                    o_DATAOUT=out,
                )
                words.append(out)
            outputs.append(Cat(*words))
        if banks == 1:
            m.d.comb += self.rdata.eq(outputs[0])
        else:
            with m.Switch(read_bank):
                for b, word in enumerate(outputs):
                    with m.Case(b):
                        m.d.comb += self.rdata.eq(word)
        return m
