"""The tile's instruction encodings: plan instructions and micro-instructions.

These layouts are the single source of truth. The gateware decodes instructions by
viewing memory words through them; the host (assembler, kernel compiler) builds
instructions with ``Layout.const({...}).as_bits()`` and reads them back with
``Layout.from_bits()``; ``docs/isa.md`` is generated from them.

Two levels of control (see ``docs/architecture.md``):

* a **plan** is a short program in one of the two plan banks; it calls kernels and,
  from the compute issue on, steers between them (BRANCH, SWITCH, ASSUME, COMMIT);
* a **kernel** lives in a kernel slot as micro-instructions (DMA, compute, waits, RET).

Opcodes not implemented by this revision of the hardware are reserved: executing one
raises an illegal-instruction fault.
"""

from amaranth.lib import data, enum


__all__ = [
    "PLAN_INSTR_BITS", "MICRO_INSTR_BITS",
    "PlanOp", "PlanInstr", "MicroOp", "COMPUTE_OPS", "GmemBase", "DmaArgs", "WaitArgs",
    "MatmulArgs",
    "AccBiasArgs", "RequantArgs", "VaddArgs", "VpoolArgs", "VclampArgs", "CmpOp", "VcmpArgs",
    "VargmaxArgs", "VcfgArgs", "VectorCfg", "VECTOR_CFG_RESET", "MicroArgs", "MicroInstr",
    "FLAGS", "INDEX_REGS", "DMA_TOKENS", "FaultCause", "TraceRecord",
]


PLAN_INSTR_BITS = 64
MICRO_INSTR_BITS = 128


FLAGS = 8          #: flag registers F0..F7, written by VCMP (and VARGMAX with ``test``),
                   #: read by BRANCH / ASSUME
INDEX_REGS = 4     #: index registers X0..X3, written by VARGMAX, read by SWITCH
DMA_TOKENS = 4     #: dependency tokens a DMA can be tagged with and WAIT can wait for


class PlanOp(enum.Enum, shape=4):
    """Plan opcodes.

    Control flow stays within the active bank, except for a failed ASSUME, which
    continues in the other bank. ``cond`` bits other than those named must be 0.
    """
    NOP    = 0   #: do nothing
    CALL   = 1   #: run kernel slot ``sel`` with arguments ``a`` and ``b``
    DONE   = 2   #: end of the plan (one inference); safe point for a bank swap
    MARK   = 3   #: write ``a`` to the MARK register (progress marker for the host)
    BRANCH = 4   #: if F[sel] == cond[0]: pc = a, else pc + 1
    SWITCH = 5   #: pc = a + X[sel]; X[sel] >= b faults with SWITCH_RANGE
    ASSUME = 6   #: open a speculative region guarded by F[sel] == cond[0]; on a miss
                 #: continue in the other bank at pc a (see docs/isa.md)
    COMMIT = 7   #: close the region: guard holds -> publish staged stores; else roll back
    JUMP   = 8   #: pc = a


class PlanInstr(data.Struct):
    """One plan instruction (64 bits)."""
    op:   PlanOp
    cond: 4     #: BRANCH/ASSUME: bit 0 is the expected flag value; other bits must be 0
    sel:  8     #: CALL: kernel slot; BRANCH/ASSUME: flag; SWITCH: index register
    a:    24    #: CALL: argument 0; MARK: marker value; branches: target PC
    b:    24    #: CALL: argument 1


class MicroOp(enum.Enum, shape=6):
    """Micro-instruction opcodes. Unlisted values are reserved (illegal)."""
    NOP       = 0   #: do nothing
    RET       = 1   #: wait for outstanding DMA and compute, then return to the plan
    DMA_LOAD  = 2   #: queue a 2-D strided copy GMEM -> scratchpad
    DMA_STORE = 3   #: queue a 2-D strided copy scratchpad -> GMEM
    WAIT      = 4   #: wait for the DMAs tagged with ``tokens`` and, with ``compute``,
                    #: for the compute unit
    MATMUL    = 8   #: ACC (+)= A^T B over k steps, R*C MACs per step
    ACC_BIAS  = 9   #: ACC[i][j] = bias[i] (int32, from the scratchpad)
    REQUANT   = 10  #: ACC -> int8 rows in the scratchpad (requantise + clamp)
    VADD      = 11  #: saturating int8 add of two requantised word streams
    VPOOL     = 12  #: max / average over windows of words (and lane pairs)
    VCLAMP    = 13  #: clamp int8 words (ReLU)
    VCMP      = 14  #: compare a lane (or the max of lanes) with an immediate -> flag
    VARGMAX   = 15  #: index of the largest of n lanes (or of one lane of n words) ->
                    #: index register; optionally (index == expect) -> flag
    VCFG      = 16  #: write a vector configuration register


#: The opcodes the compute unit executes (the rest are the kernel sequencer's own), in
#: opcode order: a tuple, so that the gateware built from it is the same every run.
COMPUTE_OPS = (MicroOp.MATMUL, MicroOp.ACC_BIAS, MicroOp.REQUANT, MicroOp.VADD,
               MicroOp.VPOOL, MicroOp.VCLAMP, MicroOp.VCMP, MicroOp.VARGMAX, MicroOp.VCFG)


class GmemBase(enum.Enum, shape=2):
    """Which value a DMA's GMEM address is relative to."""
    ABS  = 0   #: absolute word address
    ARG0 = 1   #: relative to the CALL's argument ``a``
    ARG1 = 2   #: relative to the CALL's argument ``b``


class DmaArgs(data.Struct):
    """Operands of DMA_LOAD / DMA_STORE.

    Moves ``rows`` x ``cols`` words. Row ``r``, column ``c`` is GMEM word
    ``base + gmem_addr + r * gmem_stride + c`` and scratchpad word
    ``spad_addr + r * spad_stride + c`` of the calling slot's partition.
    """
    gmem_base:   GmemBase
    gmem_addr:   24
    gmem_stride: 16
    spad_addr:   16
    spad_stride: 16
    rows:        12
    cols:        12
    token:       2    #: dependency token (see WAIT)


class WaitArgs(data.Struct):
    """Operands of WAIT: wait until no DMA tagged with a token in ``tokens`` is queued
    or running and, with ``compute``, until the compute unit is idle. ``tokens`` 0
    without ``compute`` (plain ``wait``) waits for every DMA."""
    tokens:  4        #: mask of tokens to wait for
    compute: 1        #: also wait for the compute unit (MATMUL, vector ops)


class MatmulArgs(data.Struct):
    """Operands of MATMUL.

    For t in 0..k-1, with a = word ``a_addr + t * a_stride`` and b = word
    ``b_addr + t * b_stride`` (int8 lanes): ACC[i][j] += a[i] * b[j] for i < R, j < C.
    With ``accumulate`` = 0 the first step overwrites ACC instead of adding.
    """
    a_addr:     16
    a_stride:   16
    b_addr:     16
    b_stride:   16
    k:          16
    accumulate: 1


class AccBiasArgs(data.Struct):
    """Operands of ACC_BIAS: bias[i] is the i-th little-endian int32 from word ``addr``."""
    addr: 16


class RequantArgs(data.Struct):
    """Operands of REQUANT: row i of ACC becomes word ``out_addr + i * out_stride``.

    Lane j < C is clamp(ZP_OUT + round_half_even(ACC[i][j] * M / 2**(31 + S)), LO, HI);
    M, S are MULT_A and SHIFT, or, with ``per_channel``, the int32 multiplier and the
    shift byte of row i's 8-byte entry in the table at word ``param_addr``.
    """
    out_addr:    16
    out_stride:  16
    per_channel: 1
    param_addr:  16


class VaddArgs(data.Struct):
    """Operands of VADD over ``n`` words: lane-wise
    clamp(ZP_OUT + round_half_even(((a - ZP_A) * MULT_A + (b - ZP_B) * MULT_B) / 2**(31 + SHIFT)), LO, HI).
    """
    a_addr:   16
    b_addr:   16
    out_addr: 16
    n:        12


class VpoolArgs(data.Struct):
    """Operands of VPOOL: output word o (o < n) combines, lane-wise, the ``window``
    words ``in_addr + o * in_step + t * in_stride`` (t < window); with ``pairs``, lanes
    2j and 2j+1 are combined too, into lane j (upper lanes 0). Max: the largest int8.
    Average: the sum of (x - ZP_A) requantised with MULT_A, SHIFT, ZP_OUT, LO, HI.
    """
    in_addr:   16
    in_stride: 16
    in_step:   16
    out_addr:  16
    n:         12
    window:    4
    average:   1
    pairs:     1


class VclampArgs(data.Struct):
    """Operands of VCLAMP over ``n`` words: lane-wise clamp(x, lo, hi) (int8)."""
    in_addr:  16
    out_addr: 16
    n:        12
    lo:       8
    hi:       8


class CmpOp(enum.Enum, shape=2):
    """VCMP comparisons of a signed int8 value with the immediate."""
    GE = 0   #: value >= imm
    GT = 1   #: value > imm
    LT = 2   #: value < imm
    EQ = 3   #: value == imm


class VcmpArgs(data.Struct):
    """Operands of VCMP: F[flag] = (v op imm), v = int8 lane ``lane`` of word ``addr``,
    or, with ``reduce``, the largest of lanes 0..lane of the words from ``addr`` on."""
    addr:   16
    lane:   8
    reduce: 1
    op:     CmpOp
    imm:    8
    flag:   3


class VargmaxArgs(data.Struct):
    """Operands of VARGMAX: X[index] = the lane number (0..n-1, counting across the
    words from ``addr``) of the largest int8; the lowest such lane on ties.

    With ``column``: X[index] = the word number w (0..n-1) of the largest lane ``lane``
    of the n words ``addr + w`` (the lowest w on ties); the other lanes are ignored.
    With ``test``: F[flag] = (X[index] == expect) too, written with X[index] (a write
    of the flag a speculative region is guarded by, as VCMP's). ``column`` with
    ``lane`` >= word_bytes, ``lane`` not 0 without ``column``, and ``flag`` or
    ``expect`` not 0 without ``test`` are illegal.
    """
    addr:   16
    n:      12
    index:  2
    column: 1    #: argmax of lane ``lane`` over n words (one sample's column)
    lane:   8    #: with ``column``: the lane (below word_bytes); else 0
    test:   1    #: also write F[flag] = (result == expect)
    flag:   3    #: with ``test``: the flag written; else 0
    expect: 12   #: with ``test``: the value the result is compared with; else 0


class VectorCfg(enum.Enum, shape=4):
    """Vector configuration registers (VCFG)."""
    MULT_A = 0   #: Q0.31 multiplier of input a (0 .. 2**31 - 1)
    MULT_B = 1   #: Q0.31 multiplier of input b (VADD)
    SHIFT  = 2   #: extra right shift, 0..31
    ZP_A   = 3   #: int8 zero point of input a
    ZP_B   = 4   #: int8 zero point of input b (VADD)
    ZP_OUT = 5   #: int8 zero point of the output
    LO     = 6   #: int8 lower clamp bound (reset: -128)
    HI     = 7   #: int8 upper clamp bound (reset: 127)


#: Values of the vector configuration registers after reset.
VECTOR_CFG_RESET = {VectorCfg.LO: -128, VectorCfg.HI: 127}


class VcfgArgs(data.Struct):
    """Operands of VCFG: the configuration register ``reg`` = ``value``."""
    reg:   VectorCfg
    value: 32


class MicroArgs(data.Union):
    dma: DmaArgs
    wait: WaitArgs
    matmul: MatmulArgs
    acc_bias: AccBiasArgs
    requant: RequantArgs
    vadd: VaddArgs
    vpool: VpoolArgs
    vclamp: VclampArgs
    vcmp: VcmpArgs
    vargmax: VargmaxArgs
    vcfg: VcfgArgs
    raw: 120


class MicroInstr(data.Struct):
    """One micro-instruction (128 bits)."""
    op:   MicroOp
    _pad: 2
    args: MicroArgs


class FaultCause(enum.Enum, shape=4):
    """Why the tile stopped (FAULT.cause)."""
    NONE          = 0
    ILLEGAL_PLAN  = 1   #: reserved or malformed plan instruction
    ILLEGAL_MICRO = 2   #: reserved or malformed micro-instruction
    SLOT_INVALID  = 3   #: CALL of a slot whose slot-table entry is not valid
    PARTITION     = 4   #: scratchpad access outside the slot's partition
    GMEM_RANGE    = 5   #: DMA address beyond the end of GMEM
    WATCHDOG      = 6   #: an inference ran longer than WATCHDOG cycles
    PLAN_RANGE    = 7   #: plan PC ran past the end of the bank
    SLOT_RANGE    = 8   #: micro PC ran past the end of the slot
    ABORTED       = 9   #: the host wrote CTRL.abort while a plan ran
    SWITCH_RANGE  = 10  #: SWITCH index at or beyond its table size


class TraceRecord(data.Struct):
    """One trace FIFO record, pushed when a kernel call returns (256 bits)."""
    slot:       8
    bank:       1
    faulted:    1
    _pad:       6
    pc:         16   #: plan PC of the CALL
    start:      32   #: CYCLES counter (low word) when the call began
    cycles:     32   #: cycles from CALL to return
    dma_busy:   32   #: cycles the DMA engine was busy during the call
    mac_busy:   32   #: cycles the MAC array was busy (0 until the compute ISA)
    vec_busy:   32   #: cycles the vector unit was busy (0 until the compute ISA)
    bytes_in:   32   #: bytes moved GMEM -> scratchpad
    bytes_out:  32   #: bytes moved scratchpad -> GMEM


assert PlanInstr.as_shape().size == PLAN_INSTR_BITS
assert MicroInstr.as_shape().size == MICRO_INSTR_BITS
assert TraceRecord.as_shape().size == 256
