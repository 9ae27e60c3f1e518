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
    "PlanOp", "PlanInstr", "MicroOp", "GmemBase", "DmaArgs", "MicroArgs", "MicroInstr",
    "FaultCause", "TraceRecord",
]


PLAN_INSTR_BITS = 64
MICRO_INSTR_BITS = 128


class PlanOp(enum.Enum, shape=4):
    """Plan opcodes."""
    NOP    = 0   #: do nothing
    CALL   = 1   #: run kernel slot ``sel`` with arguments ``a`` and ``b``
    DONE   = 2   #: end of the plan (one inference); safe point for a bank swap
    MARK   = 3   #: write ``a`` to the MARK register (progress marker for the host)
    BRANCH = 4   #: reserved for the compute ISA
    SWITCH = 5   #: reserved for the compute ISA
    ASSUME = 6   #: reserved for the compute ISA
    COMMIT = 7   #: reserved for the compute ISA


class PlanInstr(data.Struct):
    """One plan instruction (64 bits)."""
    op:   PlanOp
    cond: 4     #: condition / mode bits (reserved, must be 0)
    sel:  8     #: CALL: kernel slot; BRANCH/ASSUME: flag; SWITCH: index register
    a:    24    #: CALL: argument 0; MARK: marker value; branches: target PC
    b:    24    #: CALL: argument 1


class MicroOp(enum.Enum, shape=6):
    """Micro-instruction opcodes."""
    NOP       = 0   #: do nothing
    RET       = 1   #: wait for outstanding DMA, then return to the plan
    DMA_LOAD  = 2   #: 2-D strided copy GMEM -> scratchpad
    DMA_STORE = 3   #: 2-D strided copy scratchpad -> GMEM
    WAIT      = 4   #: wait until the DMA engine is idle
    # 8..63 are reserved for the compute ISA (MATMUL, vector ops, tokens).


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


class MicroArgs(data.Union):
    dma: DmaArgs
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
