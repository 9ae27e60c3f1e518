"""Clock generation for the board tops: PLL settings and the PLL primitives.

:func:`ecp5_pll_params` and :func:`ice40_pll_params` choose divider settings the way
Project Trellis' ``ecppll`` and Project IceStorm's ``icepll`` do (the same search and
the same ranges, so the same answers; ``tests/test_fpga.py`` checks that against the
tools when they are installed). They are written out here because both tools only
print Verilog or text, and the board top needs the numbers at elaboration time,
without starting a WebAssembly tool for every build.

:class:`Pll` instantiates ``EHXPLLL`` (ECP5) or ``SB_PLL40_PAD`` (iCE40).
"""

from dataclasses import dataclass

from amaranth.hdl import Elaboratable, Instance, Module, Signal


__all__ = ["PllParams", "ecp5_pll_params", "ice40_pll_params", "Pll"]


@dataclass(frozen=True)
class PllParams:
    """Divider settings of one PLL output.

    Attributes
    ----------
    family : str
        ``"ecp5"`` or ``"ice40"``.
    f_in, f_out : float
        Reference and achieved output frequency, in Hz (``f_out`` is the nearest the
        dividers reach to what was asked for).
    f_vco : float
        VCO frequency, in Hz.
    dividers : dict
        Family-specific divider values (the primitive's parameters).
    """

    family: str
    f_in: float
    f_out: float
    f_vco: float
    dividers: dict


def ecp5_pll_params(f_in, f_out):
    """ECP5 ``EHXPLLL`` settings for ``f_in`` -> ``f_out`` (Hz), as ``ecppll`` picks
    them: the nearest output frequency, then the VCO nearest 600 MHz.

    Raises
    ------
    ValueError
        If no setting is within the PLL's ranges (PFD 3.125-400 MHz, VCO 400-800 MHz,
        output 3.125-400 MHz).
    """
    if not 3.125e6 <= f_out <= 400e6:
        raise ValueError(f"an ECP5 PLL output must be 3.125 to 400 MHz, not {f_out / 1e6:g} MHz")
    best = None
    for clki_div in range(1, 129):
        f_pfd = f_in / clki_div
        if not 3.125e6 <= f_pfd <= 400e6:
            continue
        for clkfb_div in range(1, 81):
            out = f_pfd * clkfb_div
            for clkop_div in range(1, 129):
                f_vco = out * clkop_div
                if not 400e6 <= f_vco <= 800e6:
                    continue
                key = (abs(out - f_out), abs(f_vco - 600e6))
                if best is None or key < best[0]:
                    best = (key, clki_div, clkfb_div, clkop_div, out, f_vco)
    if best is None:
        raise ValueError(f"no ECP5 PLL setting makes {f_out / 1e6:g} MHz "
                         f"from {f_in / 1e6:g} MHz")
    _, clki_div, clkfb_div, clkop_div, out, f_vco = best
    return PllParams("ecp5", f_in, out, f_vco, {
        "CLKI_DIV": clki_div, "CLKFB_DIV": clkfb_div, "CLKOP_DIV": clkop_div,
        "CLKOP_CPHASE": (clkop_div - 1) // 2,
    })


def _ice40_filter_range(f_pfd):
    for limit, value in ((17e6, 1), (26e6, 2), (44e6, 3), (66e6, 4), (101e6, 5)):
        if f_pfd < limit:
            return value
    return 6


def ice40_pll_params(f_in, f_out):
    """iCE40 ``SB_PLL40`` settings (simple feedback) for ``f_in`` -> ``f_out`` (Hz), as
    ``icepll`` picks them: the nearest output frequency, first found.

    Raises
    ------
    ValueError
        If no setting is within the PLL's ranges (PFD 10-133 MHz, VCO 533-1066 MHz,
        output 16-275 MHz).
    """
    if not 16e6 <= f_out <= 275e6:
        raise ValueError(f"an iCE40 PLL output must be 16 to 275 MHz, not {f_out / 1e6:g} MHz")
    best = None
    for divr in range(16):
        f_pfd = f_in / (divr + 1)
        if not 10e6 <= f_pfd <= 133e6:
            continue
        for divf in range(128):
            f_vco = f_pfd * (divf + 1)
            if not 533e6 <= f_vco <= 1066e6:
                continue
            for divq in range(1, 7):
                out = f_vco / (1 << divq)
                if best is None or abs(out - f_out) < best[0]:
                    best = (abs(out - f_out), divr, divf, divq, out, f_vco, f_pfd)
    if best is None:
        raise ValueError(f"no iCE40 PLL setting makes {f_out / 1e6:g} MHz "
                         f"from {f_in / 1e6:g} MHz")
    _, divr, divf, divq, out, f_vco, f_pfd = best
    return PllParams("ice40", f_in, out, f_vco, {
        "DIVR": divr, "DIVF": divf, "DIVQ": divq, "FILTER_RANGE": _ice40_filter_range(f_pfd),
    })


class Pll(Elaboratable):
    """A PLL: ``clk_out`` from ``clk_in``, and its lock.

    Parameters
    ----------
    params : PllParams
    clk_in : Signal or IOPort
        The reference clock: ECP5, a signal from its input buffer; iCE40, the pad
        itself (the ``io`` of a port requested with ``dir="-"``), as ``SB_PLL40_PAD``
        takes it.
    clk_out : Signal
        Driven with the PLL's output (say ``ClockSignal("sync")``); constrained to
        ``params.f_out`` for timing analysis.

    Attributes
    ----------
    locked : Signal
        High once the PLL has locked.
    """

    def __init__(self, params, clk_in, clk_out):
        if not isinstance(params, PllParams):
            raise TypeError(f"params must be a PllParams, not {params!r}")
        self.params = params
        self.clk_in = clk_in
        self.clk_out = clk_out
        self.locked = Signal()

    def elaborate(self, platform):
        m = Module()
        p = self.params
        d = p.dividers
        if p.family == "ecp5":
            m.submodules.pll = Instance(
                "EHXPLLL",
                a_FREQUENCY_PIN_CLKI=f"{p.f_in / 1e6:g}",
                a_FREQUENCY_PIN_CLKOP=f"{p.f_out / 1e6:g}",
                a_ICP_CURRENT="12", a_LPF_RESISTOR="8",
                a_MFG_ENABLE_FILTEROPAMP="1", a_MFG_GMCREF_SEL="2",
                p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED",
                p_STDBY_ENABLE="DISABLED", p_DPHASE_SOURCE="DISABLED",
                p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
                p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD",
                p_CLKI_DIV=d["CLKI_DIV"], p_CLKOP_ENABLE="ENABLED",
                p_CLKOP_DIV=d["CLKOP_DIV"], p_CLKOP_CPHASE=d["CLKOP_CPHASE"],
                p_CLKOP_FPHASE=0, p_FEEDBK_PATH="CLKOP", p_CLKFB_DIV=d["CLKFB_DIV"],
                i_RST=0, i_STDBY=0, i_CLKI=self.clk_in, o_CLKOP=self.clk_out,
                i_CLKFB=self.clk_out, i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1,
                i_PHASESTEP=1, i_PHASELOADREG=1, i_PLLWAKESYNC=0, i_ENCLKOP=0,
                o_LOCK=self.locked,
            )
        elif p.family == "ice40":
            # The pad's own PLL: nextpnr places no other PLL beside an input on the
            # pins a PLL owns (the iCEBreaker's 12 MHz clock is on one).
            m.submodules.pll = Instance(
                "SB_PLL40_PAD",
                p_FEEDBACK_PATH="SIMPLE",
                p_DIVR=d["DIVR"], p_DIVF=d["DIVF"], p_DIVQ=d["DIVQ"],
                p_FILTER_RANGE=d["FILTER_RANGE"],
                io_PACKAGEPIN=self.clk_in, i_RESETB=1, i_BYPASS=0,
                o_PLLOUTGLOBAL=self.clk_out, o_LOCK=self.locked,
            )
        else:
            raise ValueError(f"no PLL for the {p.family!r} family")
        if platform is not None:
            platform.add_clock_constraint(self.clk_out, p.f_out)
        return m
