"""Import quantised ONNX models into the integer graph IR (:mod:`fusetile.kernels.graph`).

Two forms of quantised model are lowered:

* **QDQ**, as onnxruntime's ``quantize_static(quant_format=QuantFormat.QDQ)`` writes
  it: float operators between DequantizeLinear (DQ) and QuantizeLinear (Q) nodes. Each
  ``DQ -> op [-> Add bias] [-> Mul scale] [-> Relu | Clip ...] -> Q`` becomes one IR
  operator whose output is the Q's int8 tensor, with fixed-point requantisation
  computed from the scales as onnxruntime does (``s_x * s_w / s_y`` in float32).
  Supported ops: Conv, Gemm, MatMul (constant weights), Add (two activations),
  MaxPool, AveragePool, GlobalAveragePool, Flatten, Reshape, Squeeze, Relu, Clip,
  Identity. A Relu or Clip folds into the clamp of the op before it. Two patterns of a
  data-dependent choice become a :class:`Select`: an early exit,
  ``Where(GreaterOrEqual(ReduceMax(DQ(e)), T), DQ(e), DQ(r))`` (or ``Greater``), and
  top-1 routing, ``Gather(DQ(Q(Concat(DQ(y0), ...))), ArgMax(DQ(g)))``
  (``docs/compiler.md``).
* **QOperator** where the ONNX standard defines it: QLinearConv, QLinearMatMul
  (constant B), and MatMulInteger / ConvInteger when a ``Cast -> Mul [-> Add] ->
  QuantizeLinear`` chain turns their int32 result back into int8 (an int32 graph
  output is not supported: the tile's tensors are int8). Integer MaxPool, Relu, Clip,
  Flatten and Reshape pass through.

Tensors keep their ONNX names (the int8 outputs of Q nodes and QLinear ops); uint8
tensors are shifted into the int8 domain (``q - 128``, zero point ``- 128``, exact).
Weights must be constant int8 (or uint8); their zero point is folded into them (``w -
zero point``, int8 when it fits, as for int8 weights with zero point 0 and uint8 with 128;
otherwise int16 within -255..255, which the compiler splits into int8 planes).

Requantisations the IR has no op for are written with ops that compute them exactly
in the tile's arithmetic (and say so in ``Graph.notes``): ``Q(DQ(t))`` to other
parameters, a Relu or Flatten quantised with a scale of its own, is an Add of ``t``
with itself (scale ratios below 2) or a 1x1 convolution with weights ``k * I``; an
average whose scale ``s_x / (s_y * count)`` is 1 or more, a convolution with weights
``k`` on the channel diagonal.

Everything else raises :class:`~fusetile.kernels.graph.GraphError` naming the node and
its op: the importer never returns a graph that computes something else than the
model, up to the rounding of the fixed-point scales (and of a float bias to the
accumulator's units).

How it works: the nodes are evaluated symbolically in topological order. Each ONNX
tensor gets a *value*: a constant, an IR int8 tensor, the dequantised view of one, or
a pending result that a later QuantizeLinear turns into an IR operator (Relu, Clip,
bias Add and Mul fold into it on the way).
"""

import math
import os
from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from ..kernels.graph import (Add, AvgPool, Clamp, Conv, Dense, Flatten, Graph, GraphError,
                             MaxPool, QTensor, Requant, Select, op_inputs)


__all__ = ["load_model"]


_QTYPES = {onnx.TensorProto.INT8: np.dtype(np.int8), onnx.TensorProto.UINT8: np.dtype(np.uint8)}
_FLOAT = onnx.TensorProto.FLOAT


def load_model(model):
    """Lower a quantised ONNX model to an integer :class:`Graph`.

    Parameters
    ----------
    model : str, os.PathLike or onnx.ModelProto
        A QDQ or QOperator model with one input and one output, batch size 1.

    Returns
    -------
    Graph
        Its ``input`` is the model input after QuantizeLinear (QDQ) or the int8/uint8
        model input; its ``output`` the int8 tensor before the final DequantizeLinear,
        or the int8/uint8 model output. ``notes`` says which, and what was folded.

    Raises
    ------
    GraphError
        For anything the IR cannot express exactly.
    """
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(os.fspath(model))
    return _Importer(model).run()


# -- symbolic values ----------------------------------------------------------------------

@dataclass(frozen=True)
class _Const:
    """A constant: an initializer, a Constant node, or DequantizeLinear of one (then
    ``q``, ``scale``, ``zero_point`` and ``axis`` are the DQ's operands)."""
    value: np.ndarray
    q: np.ndarray = None
    scale: np.ndarray = None
    zero_point: np.ndarray = None
    axis: int = 1


@dataclass(frozen=True)
class _Act:
    """An int8 (or uint8) tensor of the IR, by name."""
    name: str


@dataclass(frozen=True)
class _Deq:
    """The float view (DequantizeLinear) of an IR tensor."""
    name: str


@dataclass(frozen=True)
class _FloatInput:
    """The model's float input, waiting for its QuantizeLinear."""
    name: str


@dataclass(frozen=True)
class _Pending:
    """The result of an operator that becomes an IR op once a QuantizeLinear gives it
    an int8 output. ``kind``: ``mac`` (Conv, Dense: ``acc_scale`` is the real value of
    one accumulator unit per channel, ``bias`` int accumulator units, ``extra_bias``
    real), ``add``, ``avgpool``, ``same`` (MaxPool, Flatten, Clamp: output
    quantisation = input's), ``select`` (Where, Gather: a :class:`Select`, ``fields``
    its key, mode and threshold) or ``stack`` (Concat). ``lo``, ``hi`` are real clamp
    bounds (Relu, Clip)."""
    node: str
    op_type: str
    kind: str
    cls: type
    inputs: tuple
    shape: tuple
    fields: dict
    acc_scale: np.ndarray = None
    bias: np.ndarray = None
    extra_bias: np.ndarray = None
    int32: bool = False
    lo: float = -math.inf
    hi: float = math.inf


@dataclass(frozen=True)
class _Largest:
    """ReduceMax of the dequantised IR vector ``name``: its largest element (float)."""
    name: str


@dataclass(frozen=True)
class _Test:
    """``largest element of key >= threshold`` (GreaterOrEqual / Greater of a
    :class:`_Largest` with a constant), the threshold as an int8 of ``key``."""
    key: str
    threshold: int


@dataclass(frozen=True)
class _Argmax:
    """ArgMax of the dequantised IR vector ``key`` (the first on ties)."""
    key: str


@dataclass(frozen=True)
class _Stack:
    """IR tensors of one shape and quantisation stacked along a new first axis
    (Concat, then QuantizeLinear), or its dequantised view (``deq``)."""
    members: tuple
    deq: bool = False


@dataclass
class _QParams:
    """Quantisation of an IR tensor, in the int8 domain; shared by the tensors that
    pass-through integer ops (QOperator MaxPool, Flatten...) produce from it. ``None``
    until something states it (the int8 input of a QOperator graph)."""
    dtype: np.dtype
    scale: float = None
    zero_point: int = None


def _offset(dtype):
    """What to subtract to move a value of ``dtype`` (int8 or uint8) into int8."""
    return 128 if np.dtype(dtype) == np.uint8 else 0


# -- the importer -------------------------------------------------------------------------

class _Importer:
    def __init__(self, model):
        self.model = model
        self.graph = model.graph
        self.values = {}          # ONNX tensor name -> symbolic value
        self.qp = {}              # IR tensor name -> _QParams
        self.shapes = {}          # IR tensor name -> IR shape
        self.ops = []
        self.notes = []
        self.input = None         # IR input tensor name
        self.consumers = {}       # ONNX tensor name -> number of readers
        self.onnx_shapes = {}     # ONNX tensor name -> inferred shape

    # ---- driver -------------------------------------------------------------------------

    def run(self):
        self._check_opsets()
        self._infer_shapes()
        self._count_consumers()
        for init in self.graph.initializer:
            self.values[init.name] = _Const(numpy_helper.to_array(init))
        self._bind_input()
        for index, node in enumerate(self._sorted_nodes()):
            self._visit(node, node.name or f"{node.op_type}_{index}")
        output = self._output()
        self._prune(output)
        self._fuse_clamps(output)
        return self._build(output)

    def _check_opsets(self):
        for imp in self.model.opset_import:
            if imp.domain not in ("", "ai.onnx"):
                self.notes.append(f"opset domain {imp.domain!r} declared")

    def _infer_shapes(self):
        try:
            inferred = shape_inference.infer_shapes(self.model, strict_mode=False,
                                                    data_prop=True)
        except Exception as exc:                       # noqa: BLE001 - reported, not hidden
            raise GraphError(self.graph.name, "Graph", f"shape inference failed: {exc}")
        g = inferred.graph
        for vi in list(g.value_info) + list(g.input) + list(g.output):
            t = vi.type.tensor_type
            if t.HasField("shape"):
                self.onnx_shapes[vi.name] = tuple(
                    d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                    for d in t.shape.dim)

    def _count_consumers(self):
        for node in self.graph.node:
            for name in node.input:
                if name:
                    self.consumers[name] = self.consumers.get(name, 0) + 1
        for out in self.graph.output:
            self.consumers[out.name] = self.consumers.get(out.name, 0) + 1

    def _sorted_nodes(self):
        """The nodes in topological order (ONNX requires it, but check)."""
        known = {i.name for i in self.graph.input} | {i.name for i in self.graph.initializer}
        known.add("")
        pending, order = list(self.graph.node), []
        while pending:
            rest = []
            for node in pending:
                if all(n in known for n in node.input):
                    order.append(node)
                    known.update(node.output)
                else:
                    rest.append(node)
            if len(rest) == len(pending):
                n = rest[0]
                missing = [i for i in n.input if i not in known]
                raise GraphError(n.name, n.op_type, f"inputs {missing} are never computed")
            pending = rest
        return order

    def _bind_input(self):
        inits = {i.name for i in self.graph.initializer}
        inputs = [i for i in self.graph.input if i.name not in inits]
        if len(inputs) != 1:
            raise GraphError(self.graph.name, "Graph",
                             f"{len(inputs)} graph inputs; the tile runs graphs with one")
        vi = inputs[0]
        elem = vi.type.tensor_type.elem_type
        shape = self._ir_shape(vi.name, vi.name, "Input")
        if elem == _FLOAT:
            self.values[vi.name] = _FloatInput(vi.name)
        elif elem in _QTYPES:
            self.values[vi.name] = self._new_act(vi.name, shape, _QParams(_QTYPES[elem]))
            self.input = vi.name
            self.notes.append(f"input {vi.name!r}: {_QTYPES[elem].name} model input"
                              + (" (shifted by -128)" if elem == onnx.TensorProto.UINT8 else ""))
        else:
            raise GraphError(vi.name, "Input", f"input type "
                             f"{onnx.helper.tensor_dtype_to_np_dtype(elem)} is not float, "
                             "int8 or uint8")

    def _visit(self, node, name):
        handler = getattr(self, f"_op_{node.op_type}", None)
        if node.domain not in ("", "ai.onnx") or handler is None:
            raise GraphError(name, node.op_type, "unsupported operator"
                             + (f" (domain {node.domain!r})" if node.domain else ""))
        outs = handler(node, name)
        if not isinstance(outs, tuple):
            outs = (outs,)
        for out_name, value in zip(node.output, outs):
            if out_name:
                self.values[out_name] = value
        for extra in node.output[len(outs):]:
            if extra and self.consumers.get(extra):
                raise GraphError(name, node.op_type, f"output {extra!r} is not supported")

    def _output(self):
        if len(self.graph.output) != 1:
            raise GraphError(self.graph.name, "Graph",
                             f"{len(self.graph.output)} graph outputs; the tile runs "
                             "graphs with one")
        out = self.graph.output[0].name
        v = self.values.get(out)
        if isinstance(v, _Pending) and v.kind == "same":
            v = self._materialise(out, v)
        if isinstance(v, _Act):
            self.notes.append(f"output {out!r}: {self.qp[v.name].dtype.name} model output")
            return v.name
        if isinstance(v, _Deq):
            self.notes.append(f"output {out!r}: DequantizeLinear of {v.name!r} (on the host)")
            return v.name
        if isinstance(v, _Pending) and v.int32:
            raise GraphError(v.node, v.op_type, "int32 output not supported (the tile's "
                             "tensors are int8: requantise with Cast, Mul, QuantizeLinear)")
        if isinstance(v, _Pending):
            raise GraphError(v.node, v.op_type, "the graph output is a float result: "
                             "it needs a QuantizeLinear")
        raise GraphError(out, "Output", "the graph output is not an int8 tensor or the "
                         "dequantisation of one")

    # ---- helpers ------------------------------------------------------------------------

    def _value(self, node, name, index):
        """The value of input ``index`` of ``node`` (None if absent)."""
        if index >= len(node.input) or not node.input[index]:
            return None
        return self.values[node.input[index]]

    def _const(self, node, name, index, what):
        v = self._value(node, name, index)
        if not isinstance(v, _Const):
            raise GraphError(name, node.op_type, f"{what} ({node.input[index]!r}) must be "
                             "a constant")
        return v

    def _int8_input(self, node, name, index, want=(_Act,)):
        v = self._value(node, name, index)
        if _Deq in want and isinstance(v, _Pending) and v.kind == "same":
            v = self._materialise(node.input[index], v)
        if not isinstance(v, want):
            raise GraphError(name, node.op_type, self._why_not_int8(node, index, v))
        return v.name

    def _materialise(self, tensor, p):
        """A MaxPool/Flatten/Relu result used without a QuantizeLinear is still exactly
        the dequantisation of int8 values in its input's quantisation (max, reshape and
        clamping at a grid point commute with DequantizeLinear): give it a tensor."""
        qx = self.qp[p.inputs[0]]
        for bound in (p.lo, p.hi):
            steps = bound / qx.scale if math.isfinite(bound) else 0.0
            if abs(steps - round(steps)) > 1e-4:
                raise GraphError(p.node, p.op_type, f"its result {tensor!r} is used without "
                                 "a QuantizeLinear and its bound is not on the int8 grid")
        self._new_act(tensor, p.shape, _QParams(qx.dtype, qx.scale, qx.zero_point))
        self._finish(p, tensor)
        self.values[tensor] = _Deq(tensor)
        return self.values[tensor]

    def _why_not_int8(self, node, index, v):
        tensor = node.input[index] if index < len(node.input) else "?"
        if isinstance(v, _Const):
            return f"input {tensor!r} is a constant; the IR has no constant tensors"
        if isinstance(v, _Pending):
            return (f"input {tensor!r} is the float result of {v.node!r} ({v.op_type}) "
                    "with no QuantizeLinear in between")
        if isinstance(v, _FloatInput):
            return f"input {tensor!r} is the float graph input, not quantised"
        if isinstance(v, _Deq):
            return f"input {tensor!r} is a dequantised float tensor (expected int8)"
        if isinstance(v, _Act):
            return f"input {tensor!r} is an int8 tensor (expected its dequantised view)"
        return f"input {tensor!r} is not supported"

    def _deq_input(self, node, name, index):
        return self._int8_input(node, name, index, want=(_Deq,))

    def _attrs(self, node):
        return {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def _single_use(self, node, name, index):
        """A pending value may fold into only one consumer."""
        tensor = node.input[index]
        if self.consumers.get(tensor, 0) != 1:
            v = self.values[tensor]
            raise GraphError(v.node, v.op_type, f"its float result {tensor!r} has several "
                             "consumers; each needs its own QuantizeLinear")

    def _ir_shape(self, tensor, node, op):
        """The IR shape of an ONNX tensor: batch dimension (1) stripped; (C, H, W) or (K,)."""
        shape = self.onnx_shapes.get(tensor)
        if shape is None:
            raise GraphError(node, op, f"shape of {tensor!r} unknown (shape inference "
                             "could not find it)")
        if any(not isinstance(d, int) or d <= 0 for d in shape):
            raise GraphError(node, op, f"tensor {tensor!r} has a symbolic or unknown "
                             f"dimension {shape}: only batch size 1 is supported")
        if len(shape) not in (2, 4) or shape[0] != 1:
            raise GraphError(node, op, f"tensor {tensor!r} has shape {list(shape)}: the IR "
                             "takes (1, C, H, W) and (1, K) with batch size 1")
        return tuple(shape[1:])

    def _new_act(self, name, shape, qp):
        self.qp[name] = qp
        self.shapes[name] = shape
        return _Act(name)

    def _qparams(self, node, name, scale_i, zp_i, *, out_dtype=None):
        """(scale float32, zero point shifted to int8, dtype) of a per-tensor Q/DQ."""
        scale = self._const(node, name, scale_i, "the scale").value
        zp_v = self._value(node, name, zp_i)
        if zp_v is None:
            zp, dtype = np.zeros((), dtype=out_dtype or np.uint8), np.dtype(out_dtype or np.uint8)
        else:
            zp = self._const(node, name, zp_i, "the zero point").value
            dtype = zp.dtype
        if dtype not in (np.int8, np.uint8):
            raise GraphError(name, node.op_type, f"{dtype} quantisation: only int8 and "
                             "uint8 are supported")
        if np.size(scale) != 1 or np.size(zp) != 1:
            raise GraphError(name, node.op_type, "per-channel quantisation of an activation "
                             "is not supported")
        scale = np.float32(np.asarray(scale).reshape(()).astype(np.float32))
        if not scale > 0:
            raise GraphError(name, node.op_type, f"scale {scale} is not positive")
        return float(scale), int(np.asarray(zp).reshape(())) - _offset(dtype), np.dtype(dtype)

    def _claim(self, tensor, scale, zp, node, op):
        """``node`` states the quantisation of IR tensor ``tensor``: record or check it."""
        qp = self.qp[tensor]
        for field_, value in (("scale", scale), ("zero_point", zp)):
            if value is None:
                continue
            have = getattr(qp, field_)
            if have is None:
                setattr(qp, field_, value)
            elif have != value:
                raise GraphError(node, op, f"{tensor!r} quantised with {field_} {have} but "
                                 f"used with {value}: requantisation is not supported here")

    # ---- quantisation nodes -------------------------------------------------------------

    def _op_QuantizeLinear(self, node, name):
        a = self._attrs(node)
        if a.get("block_size", 0):
            raise GraphError(name, node.op_type, "blocked quantisation is not supported")
        out_dtype = onnx.helper.tensor_dtype_to_np_dtype(a["output_dtype"]) \
            if a.get("output_dtype") else None
        scale, zp, dtype = self._qparams(node, name, 1, 2, out_dtype=out_dtype)
        v = self._value(node, name, 0)
        y = node.output[0]
        if isinstance(v, _FloatInput):
            if self.input is not None:
                qp = self.qp[self.input]
                if (qp.scale, qp.zero_point) != (scale, zp):
                    raise GraphError(name, node.op_type, "the float input is quantised "
                                     "twice, with different parameters")
                return _Act(self.input)
            self.input = y
            self.notes.append(f"input {v.name!r}: float, quantised by {name!r} (on the host)")
            return self._new_act(y, self._ir_shape(v.name, name, node.op_type),
                                 _QParams(dtype, scale, zp))
        if isinstance(v, _Deq):
            return self._requant_alias(node, name, v.name, scale, zp)
        if isinstance(v, _Pending) and v.kind == "stack":
            self._single_use(node, name, 0)
            return _Stack(tuple(self._requantised(f"{v.node}:{i}", t, dtype, scale, zp)
                                for i, t in enumerate(v.inputs)))
        if isinstance(v, _Pending):
            if v.int32:
                raise GraphError(name, node.op_type, "QuantizeLinear of an int32 tensor")
            self._single_use(node, name, 0)
            act = self._new_act(y, v.shape, _QParams(dtype, scale, zp))
            self._finish(v, y)
            return act
        raise GraphError(name, node.op_type, self._why_not_int8(node, 0, v))

    def _requant_alias(self, node, name, tensor, scale, zp):
        """Q(DQ(t)): t itself with t's own parameters, else a requantisation."""
        return _Act(self._requantised(node.output[0], tensor, self.qp[tensor].dtype, scale,
                                      zp, op=name))

    def _requantised(self, y, tensor, dtype, scale, zp, *, op=None):
        """``tensor``, or a new tensor ``y`` requantised to ``scale``, ``zp`` (by an op
        named ``op``, default ``y``)."""
        qp = self.qp[tensor]
        if (qp.scale, qp.zero_point) == (scale, zp):
            return tensor
        self._new_act(y, self.shapes[tensor], _QParams(dtype, scale, zp))
        self._emit_requant(op or y, tensor, y, -128, 127)
        return y

    def _op_DequantizeLinear(self, node, name):
        a = self._attrs(node)
        if a.get("block_size", 0):
            raise GraphError(name, node.op_type, "blocked quantisation is not supported")
        v = self._value(node, name, 0)
        if isinstance(v, _Stack) and not v.deq:
            scale, zp, dtype = self._qparams(node, name, 1, 2,
                                             out_dtype=self.qp[v.members[0]].dtype)
            for t in v.members:
                self._claim(t, scale, zp, name, node.op_type)
            return _Stack(v.members, deq=True)
        if isinstance(v, _Const):
            scale = np.asarray(self._const(node, name, 1, "the scale").value)
            zpv = self._value(node, name, 2)
            zp = np.zeros((), v.value.dtype) if zpv is None else \
                np.asarray(self._const(node, name, 2, "the zero point").value)
            axis = a.get("axis", 1)
            real = self._dequantize(v.value, scale, zp, axis)
            return _Const(real, q=v.value, scale=scale, zero_point=zp, axis=axis)
        if isinstance(v, _Act):
            scale, zp, dtype = self._qparams(node, name, 1, 2,
                                             out_dtype=self.qp[v.name].dtype)
            if dtype != self.qp[v.name].dtype:
                raise GraphError(name, node.op_type, f"zero point type {dtype} does not "
                                 f"match the tensor's {self.qp[v.name].dtype}")
            self._claim(v.name, scale, zp, name, node.op_type)
            return _Deq(v.name)
        raise GraphError(name, node.op_type, self._why_not_int8(node, 0, v))

    @staticmethod
    def _dequantize(q, scale, zp, axis):
        """Float32 ``(q - zp) * scale``, per channel along ``axis`` for 1-D scales."""
        q = np.asarray(q)
        if np.ndim(scale) == 1 and np.size(scale) > 1 and q.ndim > 1:
            shape = [1] * q.ndim
            shape[axis % q.ndim] = -1
            scale, zp = scale.reshape(shape), np.asarray(zp).reshape(shape if np.size(zp) > 1
                                                                     else ())
        return ((q.astype(np.int64) - zp.astype(np.int64)).astype(np.float32) *
                scale.astype(np.float32))

    # ---- weights, biases and convolution geometry --------------------------------------

    def _weight(self, node, name, const, out_axis, what="weight"):
        """Int8 weights with the output channel first, and the per-channel scale.

        ``const`` is the DequantizeLinear of an int8/uint8 initializer (or, for
        QOperator nodes, a _Const assembled from its operands)."""
        if const.q is None:
            raise GraphError(name, node.op_type, f"the {what} is a float constant, not "
                             "quantised (DequantizeLinear of an int8 initializer)")
        q = np.asarray(const.q)
        if q.dtype not in (np.int8, np.uint8):
            raise GraphError(name, node.op_type, f"{what} type {q.dtype}: only int8 and "
                             "uint8 weights are supported")
        out_axis %= q.ndim
        n = q.shape[out_axis]
        scale = self._per_channel(node, name, const.scale, const.axis, q.ndim, out_axis, n,
                                  f"{what} scale")
        zp = self._per_channel(node, name, const.zero_point, const.axis, q.ndim, out_axis, n,
                               f"{what} zero point")
        w = np.moveaxis(q.astype(np.int64), out_axis, 0)
        w = w - zp.astype(np.int64).reshape((-1,) + (1,) * (w.ndim - 1))
        if w.size and (w.min() < -128 or w.max() > 127):
            # w - zp spans up to -255..255: int16, split into int8 planes by the compiler
            return w.astype(np.int16), scale.astype(_scale_type(scale.dtype))
        return w.astype(np.int8), scale.astype(_scale_type(scale.dtype))

    def _per_channel(self, node, name, v, axis, ndim, out_axis, n, what):
        v = np.asarray(v if v is not None else 0).reshape(-1)
        if v.size == 1:
            return np.repeat(v, n)
        if v.size != n or axis % ndim != out_axis:
            raise GraphError(name, node.op_type, f"per-channel {what} along axis {axis} "
                             f"({v.size} values): only the output-channel axis is supported")
        return v

    def _bias(self, node, name, const, acc_scale, n):
        """Int32 bias in accumulator units (``acc_scale`` per channel)."""
        if const is None:
            return np.zeros(n, dtype=np.int64)
        if const.q is not None and np.asarray(const.q).dtype == np.int32 and \
                np.allclose(self._vec(node, name, np.asarray(const.scale, np.float64), n),
                            acc_scale, rtol=1e-5, atol=0):
            # The quantiser's scale s_x * s_w: use the integers as onnxruntime does.
            zp = self._vec(node, name, np.asarray(const.zero_point), n)
            bias = self._vec(node, name, np.asarray(const.q), n).astype(np.int64) - zp
        else:
            real = self._vec(node, name, np.asarray(const.value, np.float64), n)
            bias = np.rint(real / acc_scale.astype(np.float64)).astype(np.int64)
            self.notes.append(f"{name}: bias rounded to accumulator units")
        if np.abs(bias).max(initial=0) >= 2**31:
            raise GraphError(name, node.op_type, "bias does not fit int32")
        return bias

    def _vec(self, node, name, v, n):
        """A per-channel vector of ``n`` from a scalar or something that squeezes to n."""
        v = np.asarray(v).reshape(-1) if np.size(v) in (1, n) else None
        if v is None:
            raise GraphError(name, node.op_type, f"bias or scale shape does not match the "
                             f"{n} output channels")
        return np.broadcast_to(v, (n,)).copy()

    def _geometry(self, node, name, kernel, *, pool):
        """(stride, pads) of a 2-D Conv or pool, checking what the IR cannot express."""
        a = self._attrs(node)
        op = node.op_type
        if len(kernel) != 2:
            raise GraphError(name, op, f"{len(kernel)}-D kernels: only 2-D is supported")
        if "kernel_shape" in a and tuple(a["kernel_shape"]) != tuple(kernel):
            raise GraphError(name, op, "kernel_shape does not match the weights")
        if any(d != 1 for d in a.get("dilations", [1, 1])):
            raise GraphError(name, op, f"dilations {list(a['dilations'])}: only 1 is supported")
        if a.get("group", 1) != 1:
            raise GraphError(name, op, f"group {a['group']}: grouped and depthwise "
                             "convolutions are not supported")
        if a.get("ceil_mode", 0):
            raise GraphError(name, op, "ceil_mode=1 is not supported")
        auto_pad = a.get("auto_pad", b"NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        if auto_pad not in ("NOTSET", "VALID"):
            raise GraphError(name, op, f"auto_pad {auto_pad} is not supported (only "
                             "NOTSET, VALID)")
        stride = tuple(a.get("strides", [1, 1]))
        pads = tuple(a.get("pads", [0, 0, 0, 0])) if auto_pad == "NOTSET" else (0, 0, 0, 0)
        if len(stride) != 2 or len(pads) != 4 or min(stride) < 1 or min(pads) < 0:
            raise GraphError(name, op, f"strides {list(stride)}, pads {list(pads)} invalid")
        if pool and any(p >= k for p, k in zip(pads, kernel + kernel)):
            raise GraphError(name, op, "padding as large as the kernel")
        return stride, pads

    def _map_input(self, node, name, x):
        shape = self.shapes[x]
        if len(shape) != 3:
            raise GraphError(name, node.op_type, f"input {x!r} has shape {shape}, not a "
                             "(C, H, W) feature map")
        return shape

    def _out_shape(self, node, name):
        return self._ir_shape(node.output[0], name, node.op_type)

    # ---- compute ops (QDQ) --------------------------------------------------------------

    def _op_Conv(self, node, name):
        x = self._deq_input(node, name, 0)
        w, s_w = self._weight(node, name, self._const(node, name, 1, "the weight"), 0)
        acc_scale = self._acc_scale(x, s_w)
        bias = self._bias(node, name, self._value(node, name, 2), acc_scale, len(w))
        return self._conv_pending(node, name, x, w, acc_scale, bias)

    def _conv_pending(self, node, name, x, w, acc_scale, bias, int32=False):
        c, h, wd = self._map_input(node, name, x)
        stride, pads = self._geometry(node, name, w.shape[2:], pool=False)
        if w.ndim != 4 or w.shape[1] != c:
            raise GraphError(name, node.op_type, f"weights {w.shape} do not match the "
                             f"{c}-channel input")
        return _Pending(name, node.op_type, "mac", Conv, (x,), self._out_shape(node, name),
                        dict(weight=w, stride=stride, pads=pads), acc_scale=acc_scale,
                        bias=bias, extra_bias=np.zeros(len(w)), int32=int32)

    def _acc_scale(self, x, s_w):
        """Real value of one accumulator unit, ``s_x * s_w`` per channel, computed as
        onnxruntime and onnx's reference do: in the scales' float type (float32, or
        float16 when all are float16)."""
        s_x = self.qp[x].scale
        s_x = 1.0 if s_x is None else s_x
        kind = s_w.dtype.type
        if kind(s_x) != s_x:            # not a float16 value: compute in float32
            kind = np.float32
        return (kind(s_x) * s_w.astype(kind)).astype(kind)

    def _dense_pending(self, node, name, x, w, acc_scale, bias, int32=False):
        k = int(np.prod(self.shapes[x]))
        if w.ndim != 2 or w.shape[1] != k:
            raise GraphError(name, node.op_type, f"weights {w.shape} do not match the "
                             f"input of {k} values")
        return _Pending(name, node.op_type, "mac", Dense, (x,), self._out_shape(node, name),
                        dict(weight=w), acc_scale=acc_scale, bias=bias,
                        extra_bias=np.zeros(len(w)), int32=int32)

    def _vector_input(self, node, name, x):
        if len(self.shapes[x]) != 1:
            raise GraphError(name, node.op_type, f"input {x!r} has shape {self.shapes[x]}: "
                             "flatten it to (1, K) first")

    def _op_Gemm(self, node, name):
        a = self._attrs(node)
        if a.get("transA", 0):
            raise GraphError(name, node.op_type, "transA=1 is not supported")
        x = self._deq_input(node, name, 0)
        self._vector_input(node, name, x)
        trans_b = a.get("transB", 0)
        w, s_w = self._weight(node, name, self._const(node, name, 1, "B"), 0 if trans_b else 1)
        acc_scale = self._acc_scale(x, s_w)
        if a.get("alpha", 1.0) != 1.0:
            if a["alpha"] <= 0:
                raise GraphError(name, node.op_type, "alpha must be positive")
            acc_scale = (acc_scale * np.float32(a["alpha"])).astype(np.float32)
        c = self._value(node, name, 2)
        if c is not None and not isinstance(c, _Const):
            raise GraphError(name, node.op_type, "C must be a constant")
        beta = a.get("beta", 1.0)
        if c is not None and beta != 1.0:
            c = _Const(np.asarray(c.value, np.float64) * beta)
        bias = self._bias(node, name, c, acc_scale, len(w))
        return self._dense_pending(node, name, x, w, acc_scale, bias)

    def _op_MatMul(self, node, name):
        x = self._deq_input(node, name, 0)
        self._vector_input(node, name, x)
        b = self._const(node, name, 1, "B (the weights)")
        if np.ndim(b.value) != 2:
            raise GraphError(name, node.op_type, f"B of shape {np.shape(b.value)}: only "
                             "2-D constant B is supported")
        w, s_w = self._weight(node, name, b, 1)
        return self._dense_pending(node, name, x, w, self._acc_scale(x, s_w),
                                   np.zeros(len(w), np.int64))

    def _op_Add(self, node, name):
        va, vb = self._value(node, name, 0), self._value(node, name, 1)
        for p, c, i in ((va, vb, 0), (vb, va, 1)):
            if isinstance(p, _Pending) and p.kind == "mac" and isinstance(c, _Const):
                return self._fold_bias(node, name, p, c, i)
        for c, other in ((va, node.input[1]), (vb, node.input[0])):
            if isinstance(c, _Const):
                raise GraphError(name, node.op_type, f"adds a constant tensor to "
                                 f"{other!r}: the IR has no constant tensors (a MatMul bias "
                                 "quantised separately? onnxruntime.quantization."
                                 "quant_pre_process fuses MatMul + Add into Gemm)")
        a = self._deq_input(node, name, 0)
        b = self._deq_input(node, name, 1)
        if self.shapes[a] != self.shapes[b]:
            raise GraphError(name, node.op_type, f"shapes {self.shapes[a]} and "
                             f"{self.shapes[b]}: broadcasting is not supported")
        return _Pending(name, node.op_type, "add", Add, (a, b), self._out_shape(node, name), {})

    def _channel_const(self, node, name, p, c):
        """A constant that acts per output channel of ``p`` (scalar, (N,), (1, N),
        (C, 1, 1) or (1, C, 1, 1))."""
        n = len(p.fields["weight"])
        v = np.asarray(c.value, np.float64)
        if v.size == 1:
            return np.full(n, v.item())
        axis = -3 if p.cls is Conv else -1         # the channel axis, broadcasting right
        if v.size != n or v.ndim < -axis or v.shape[axis] != n:
            raise GraphError(name, node.op_type, f"constant of shape {v.shape} is not per "
                             f"output channel of {p.node!r}")
        return v.reshape(-1)

    def _fold_bias(self, node, name, p, c, index):
        self._single_use(node, name, index)
        if p.int32 or p.lo != -math.inf or p.hi != math.inf:
            raise GraphError(name, node.op_type, f"Add after the Relu/Clip or before the "
                             f"Cast of {p.node!r} cannot fold into its bias")
        extra = p.extra_bias + self._channel_const(node, name, p, c)
        self.notes.append(f"{name}: constant Add folded into the bias of {p.node!r}")
        return replace(p, extra_bias=extra)

    def _op_Mul(self, node, name):
        va, vb = self._value(node, name, 0), self._value(node, name, 1)
        for p, c, i in ((va, vb, 0), (vb, va, 1)):
            if isinstance(p, _Pending) and p.kind == "mac" and isinstance(c, _Const):
                self._single_use(node, name, i)
                if p.int32 or p.lo != -math.inf or p.hi != math.inf:
                    raise GraphError(name, node.op_type, f"Mul after the Relu/Clip or "
                                     f"before the Cast of {p.node!r} is not supported")
                m = self._channel_const(node, name, p, c).astype(np.float32)
                if not np.all(m > 0):
                    raise GraphError(name, node.op_type, "only positive scales fold into "
                                     "the requantisation")
                self.notes.append(f"{name}: Mul folded into the scale of {p.node!r}")
                return replace(p, acc_scale=(p.acc_scale * m).astype(np.float32),
                               extra_bias=p.extra_bias * m)
        raise GraphError(name, node.op_type, "only a Mul of a Conv/Gemm/MatMul result by a "
                         "constant scale is supported")

    def _op_Cast(self, node, name):
        v = self._value(node, name, 0)
        to = self._attrs(node).get("to")
        if isinstance(v, _Pending) and v.int32 and to == _FLOAT:
            self._single_use(node, name, 0)
            return replace(v, int32=False)
        raise GraphError(name, node.op_type, "only a Cast of a MatMulInteger/ConvInteger "
                         "result to float is supported")

    def _op_Relu(self, node, name):
        return self._clamp(node, name, 0.0, math.inf)

    def _op_Clip(self, node, name):
        a = self._attrs(node)
        bounds = [a.get("min", -math.inf), a.get("max", math.inf)]     # opset < 11
        for i in (1, 2):                                                 # opset >= 11
            if self._value(node, name, i) is not None:
                bounds[i - 1] = float(np.asarray(
                    self._const(node, name, i, "the bound").value).reshape(()))
        return self._clamp(node, name, *bounds)

    def _clamp(self, node, name, lo, hi):
        """Relu / Clip: folds into a pending op, or becomes an IR Clamp."""
        v = self._value(node, name, 0)
        if isinstance(v, _Pending) and not v.int32:
            self._single_use(node, name, 0)
            return replace(v, lo=max(v.lo, lo), hi=min(v.hi, hi))
        if isinstance(v, _Deq):
            shape = self.shapes[v.name]
            return _Pending(name, node.op_type, "same", Clamp, (v.name,), shape, {},
                            lo=lo, hi=hi)
        if isinstance(v, _Act):
            # Integer Relu/Clip (QOperator): the bounds are integers of the tensor's type.
            off = _offset(self.qp[v.name].dtype)
            ilo = -128 if lo == -math.inf else int(np.clip(math.ceil(lo) - off, -128, 127))
            ihi = 127 if hi == math.inf else int(np.clip(math.floor(hi) - off, -128, 127))
            return self._emit_same(Clamp(name, v.name, node.output[0], ilo, ihi), v.name,
                                   self.shapes[v.name])
        raise GraphError(name, node.op_type, self._why_not_int8(node, 0, v))

    def _emit_same(self, op, x, shape):
        """An integer op whose output shares its input's quantisation (QOperator)."""
        self.ops.append(op)
        return self._new_act(op.y, shape, self.qp[x])

    def _op_MaxPool(self, node, name):
        v = self._value(node, name, 0)
        x = self._int8_input(node, name, 0, want=(_Deq, _Act))
        self._map_input(node, name, x)
        kernel = tuple(self._attrs(node).get("kernel_shape", ()))
        stride, pads = self._geometry(node, name, kernel, pool=True)
        fields = dict(kernel=kernel, stride=stride, pads=pads)
        shape = self._out_shape(node, name)
        if isinstance(v, _Act):
            return self._emit_same(MaxPool(name, x, node.output[0], **fields), x, shape)
        return _Pending(name, node.op_type, "same", MaxPool, (x,), shape, fields)

    def _op_AveragePool(self, node, name):
        x = self._deq_input(node, name, 0)
        self._map_input(node, name, x)
        a = self._attrs(node)
        kernel = tuple(a.get("kernel_shape", ()))
        stride, pads = self._geometry(node, name, kernel, pool=True)
        return _Pending(name, node.op_type, "avgpool", AvgPool, (x,),
                        self._out_shape(node, name),
                        dict(kernel=kernel, stride=stride, pads=pads,
                             count_include_pad=bool(a.get("count_include_pad", 0))))

    def _op_GlobalAveragePool(self, node, name):
        x = self._deq_input(node, name, 0)
        _, h, w = self._map_input(node, name, x)
        return _Pending(name, node.op_type, "avgpool", AvgPool, (x,),
                        self._out_shape(node, name),
                        dict(kernel=(h, w), stride=(h, w), pads=(0, 0, 0, 0)))

    def _op_Flatten(self, node, name):
        if self._attrs(node).get("axis", 1) != 1:
            raise GraphError(name, node.op_type, "only axis=1 is supported")
        return self._reshape(node, name)

    def _op_Reshape(self, node, name):
        return self._reshape(node, name)

    def _op_Squeeze(self, node, name):
        return self._reshape(node, name)

    def _reshape(self, node, name):
        """Flatten/Reshape/Squeeze: to (1, K) is the IR's Flatten; to the same shape is
        nothing; anything else is not expressible."""
        if isinstance(self._value(node, name, 0), _FloatInput):
            # Flattening the float input before its QuantizeLinear moves no data: the
            # IR input is then the flat tensor (host samples reshape to it in C, H, W).
            self.notes.append(f"{name}: {node.op_type} of the float input")
            return _FloatInput(node.output[0])
        x = self._int8_input(node, name, 0, want=(_Deq, _Act))
        v = self._value(node, name, 0)
        shape = self._out_shape(node, name)
        if shape == self.shapes[x]:
            return v
        if shape != (int(np.prod(self.shapes[x])),):
            raise GraphError(name, node.op_type, f"reshape {self.shapes[x]} -> {shape}: only "
                             "flattening to (1, K) is supported")
        if isinstance(v, _Act):
            return self._emit_same(Flatten(name, x, node.output[0]), x, shape)
        return _Pending(name, node.op_type, "same", Flatten, (x,), shape, {})

    # ---- data-dependent choices (early exit, mixture of experts) -----------------------

    def _key(self, node, name, axis_attr):
        """The dequantised IR vector a ReduceMax / ArgMax reduces, checking that it
        reduces the whole vector."""
        key = self._deq_input(node, name, 0)
        if len(self.shapes[key]) != 1:
            raise GraphError(name, node.op_type, f"reduces {self.shapes[key]}: the tile "
                             "reduces vectors (1, K)")
        axes = self._attrs(node).get(axis_attr)
        if axis_attr == "axes" and len(node.input) > 1 and node.input[1]:
            axes = self._const(node, name, 1, "axes").value.reshape(-1).tolist()
        if axes is not None and set(np.atleast_1d(axes).tolist()) - {0, 1, -1}:
            raise GraphError(name, node.op_type, f"axes {axes}: only the last is supported")
        return key

    def _op_ReduceMax(self, node, name):
        if self._attrs(node).get("noop_with_empty_axes", 0):
            raise GraphError(name, node.op_type, "noop_with_empty_axes is not supported")
        return _Largest(self._key(node, name, "axes"))

    def _op_GreaterOrEqual(self, node, name):
        return self._test(node, name, np.greater_equal)

    def _op_Greater(self, node, name):
        return self._test(node, name, np.greater)

    def _test(self, node, name, compare):
        """``ReduceMax(DQ(key)) >= T``: the smallest int8 of ``key`` whose dequantised
        value (float32, as DequantizeLinear computes it) passes, 128 if none does."""
        v = self._value(node, name, 0)
        if not isinstance(v, _Largest):
            raise GraphError(name, node.op_type, "the tile compares the largest element of "
                             "a dequantised vector (ReduceMax) with a constant")
        t = self._const(node, name, 1, "the threshold").value
        if np.size(t) != 1:
            raise GraphError(name, node.op_type, "the threshold must be a scalar")
        qp = self.qp[v.name]
        q = np.arange(-128, 128)
        real = (q - qp.zero_point).astype(np.float32) * np.float32(qp.scale)
        passing = q[compare(real, np.float32(np.asarray(t).reshape(())))]
        return _Test(v.name, int(passing.min()) if passing.size else 128)

    def _op_ArgMax(self, node, name):
        a = self._attrs(node)
        if a.get("select_last_index", 0):
            raise GraphError(name, node.op_type, "select_last_index=1: the tile's VARGMAX "
                             "takes the first of equal values")
        return _Argmax(self._key(node, name, "axis"))

    def _op_Where(self, node, name):
        cond = self._value(node, name, 0)
        if not isinstance(cond, _Test):
            raise GraphError(name, node.op_type, "the condition must be ReduceMax(x) >= "
                             "constant (an early exit)")
        a, b = self._deq_input(node, name, 1), self._deq_input(node, name, 2)
        return self._select(node, name, (a, b), key=cond.key, mode="threshold",
                            threshold=cond.threshold)

    def _op_Concat(self, node, name):
        members = [self._deq_input(node, name, i) for i in range(len(node.input))]
        if self._attrs(node).get("axis") != 0:
            raise GraphError(name, node.op_type, "only Concat along axis 0 (stacking the "
                             "inputs of a Gather) is supported")
        if len({self.shapes[m] for m in members}) != 1:
            raise GraphError(name, node.op_type, "inputs of different shapes")
        return _Pending(name, node.op_type, "stack", None, tuple(members),
                        self.shapes[members[0]], {})

    def _op_Gather(self, node, name):
        stack, index = self._value(node, name, 0), self._value(node, name, 1)
        if not (isinstance(stack, _Stack) and stack.deq and isinstance(index, _Argmax)) or \
                self._attrs(node).get("axis", 0) != 0:
            raise GraphError(name, node.op_type, "the tile gathers along axis 0 of "
                             "stacked results with the ArgMax of a vector (top-1 routing)")
        if self.shapes[index.key] != (len(stack.members),):
            raise GraphError(name, node.op_type, f"{len(stack.members)} inputs chosen by "
                             f"the ArgMax of {self.shapes[index.key][0]} values")
        return self._select(node, name, stack.members, key=index.key, mode="argmax")

    def _select(self, node, name, inputs, **fields):
        shape = self._out_shape(node, name)
        if any(self.shapes[t] != shape for t in inputs):
            raise GraphError(name, node.op_type, "the chosen inputs must have the output's "
                             "shape (no broadcasting)")
        return _Pending(name, node.op_type, "select", Select, tuple(inputs), shape, fields)

    def _op_Identity(self, node, name):
        return self._value(node, name, 0)

    def _op_Constant(self, node, name):
        a = self._attrs(node)
        if "value" in a:
            return _Const(numpy_helper.to_array(a["value"]))
        for key, dtype in (("value_float", np.float32), ("value_floats", np.float32),
                           ("value_int", np.int64), ("value_ints", np.int64)):
            if key in a:
                return _Const(np.asarray(a[key], dtype=dtype))
        raise GraphError(name, node.op_type, f"constant attribute {list(a)} not supported")

    # ---- QOperator ----------------------------------------------------------------------

    def _qlinear_input(self, node, name, index, scale_i, zp_i):
        """The int8 input of a QLinear op; its stated quantisation must agree."""
        x = self._int8_input(node, name, index)
        scale, zp, dtype = self._qparams(node, name, scale_i, zp_i,
                                         out_dtype=self.qp[x].dtype)
        if dtype != self.qp[x].dtype:
            raise GraphError(name, node.op_type, f"zero point type {dtype} does not match "
                             f"the {self.qp[x].dtype} input")
        self._claim(x, scale, zp, name, node.op_type)
        return x

    def _qlinear_weight(self, node, name, w_i, out_axis, scale_i=None, zp_i=None):
        w = self._const(node, name, w_i, "the weight")
        scale = (np.asarray(self._const(node, name, scale_i, "the weight scale").value)
                 if scale_i is not None else np.ones((), np.float32))
        zpv = self._value(node, name, zp_i) if zp_i is not None else None
        zp = (np.asarray(self._const(node, name, zp_i, "the weight zero point").value)
              if zpv is not None else np.zeros((), np.asarray(w.value).dtype))
        if np.size(scale) > 1 or np.size(zp) > 1:
            axis = out_axis
        else:
            axis = 1
        return self._weight(node, name, _Const(w.value, q=w.value, scale=scale,
                                               zero_point=zp, axis=axis), out_axis)

    def _qlinear_output(self, node, name, pending, scale_i, zp_i):
        scale, zp, dtype = self._qparams(node, name, scale_i, zp_i)
        y = node.output[0]
        act = self._new_act(y, pending.shape, _QParams(dtype, scale, zp))
        self._finish(pending, y)
        return act

    def _op_QLinearConv(self, node, name):
        x = self._qlinear_input(node, name, 0, 1, 2)
        w, s_w = self._qlinear_weight(node, name, 3, 0, 4, 5)
        acc_scale = self._acc_scale(x, s_w)
        b = self._value(node, name, 8)
        if b is not None:
            b = self._const(node, name, 8, "the bias")
            if np.asarray(b.value).dtype != np.int32:
                raise GraphError(name, node.op_type, "bias must be int32")
            b = _Const(b.value, q=b.value, scale=acc_scale, zero_point=np.zeros((), np.int32))
        bias = self._bias(node, name, b, acc_scale, len(w))
        return self._qlinear_output(node, name,
                                    self._conv_pending(node, name, x, w, acc_scale, bias),
                                    6, 7)

    def _op_QLinearMatMul(self, node, name):
        x = self._qlinear_input(node, name, 0, 1, 2)
        self._vector_input(node, name, x)
        b = self._const(node, name, 3, "B (the weights)")
        if np.ndim(b.value) != 2:
            raise GraphError(name, node.op_type, f"B of shape {np.shape(b.value)}: only "
                             "2-D constant B is supported")
        w, s_w = self._qlinear_weight(node, name, 3, 1, 4, 5)
        pending = self._dense_pending(node, name, x, w, self._acc_scale(x, s_w),
                                      np.zeros(len(w), np.int64))
        return self._qlinear_output(node, name, pending, 6, 7)

    def _integer_input(self, node, name, zp_i):
        x = self._int8_input(node, name, 0)
        zpv = self._value(node, name, zp_i)
        if zpv is not None:
            zp = np.asarray(self._const(node, name, zp_i, "the input zero point").value)
            if zp.size != 1:
                raise GraphError(name, node.op_type, "per-row input zero points are not "
                                 "supported")
            zp = int(zp.reshape(())) - _offset(zp.dtype)
        else:
            zp = -_offset(self.qp[x].dtype)
        self._claim(x, None, zp, name, node.op_type)
        return x

    def _op_MatMulInteger(self, node, name):
        x = self._integer_input(node, name, 2)
        self._vector_input(node, name, x)
        b = self._const(node, name, 1, "B (the weights)")
        if np.ndim(b.value) != 2:
            raise GraphError(name, node.op_type, f"B of shape {np.shape(b.value)}: only "
                             "2-D constant B is supported")
        w, _ = self._qlinear_weight(node, name, 1, 1, None, 3)
        return self._dense_pending(node, name, x, w, np.ones(len(w), np.float32),
                                   np.zeros(len(w), np.int64), int32=True)

    def _op_ConvInteger(self, node, name):
        x = self._integer_input(node, name, 2)
        w, _ = self._qlinear_weight(node, name, 1, 0, None, 3)
        return self._conv_pending(node, name, x, w, np.ones(len(w), np.float32),
                                  np.zeros(len(w), np.int64), int32=True)

    # ---- turning pending results into IR ops --------------------------------------------

    def _bounds(self, p, y):
        """Int8 clamp bounds of the real interval [p.lo, p.hi] in ``y``'s quantisation:
        Q is monotonic, so Q(clip(v, lo, hi)) = clamp(Q(v), Q(lo), Q(hi)) exactly."""
        qp = self.qp[y]
        s = np.float32(qp.scale)

        def q(bound, default):
            if math.isinf(bound):
                return default
            return int(np.clip(np.rint(np.float32(bound) / s) + qp.zero_point, -128, 127))
        return q(p.lo, -128), q(p.hi, 127)

    def _finish(self, p, y):
        """Emit the IR op of pending ``p`` with output ``y`` (its quantisation known)."""
        lo, hi = self._bounds(p, y)
        qy = self.qp[y]
        if p.kind == "mac":
            self._finish_mac(p, y, lo, hi)
        elif p.kind == "add":
            mult_a, mult_b, shift = _add_multipliers(
                self.qp[p.inputs[0]].scale / qy.scale, self.qp[p.inputs[1]].scale / qy.scale,
                p.node)
            self.ops.append(Add(p.node, p.inputs[0], p.inputs[1], y, mult_a, mult_b, shift,
                                lo, hi))
        elif p.kind == "avgpool":
            self._finish_avgpool(p, y, lo, hi)
        elif p.kind == "select":
            qy = self.qp[y]
            inputs = tuple(self._requantised(f"{p.node}:in{i}", t, qy.dtype, qy.scale,
                                             qy.zero_point) for i, t in enumerate(p.inputs))
            self.ops.append(Select(p.node, y=y, inputs=inputs, **p.fields))
        else:
            self._finish_same(p, y, lo, hi)

    def _finish_mac(self, p, y, lo, hi):
        kind = p.acc_scale.dtype.type
        if kind(self.qp[y].scale) != self.qp[y].scale:
            kind = np.float32
        # s_x * s_w / s_y in the scales' float type, as onnxruntime and onnx's reference
        scales = (p.acc_scale.astype(kind) / kind(self.qp[y].scale)).astype(kind)
        requant = Requant.from_scales(scales, node=p.node, op=p.op_type)
        bias = p.bias + np.rint(p.extra_bias / p.acc_scale.astype(np.float64)).astype(np.int64)
        if np.abs(bias).max(initial=0) >= 2**31:
            raise GraphError(p.node, p.op_type, "bias does not fit int32")
        self.ops.append(p.cls(p.node, p.inputs[0], y, bias=bias.astype(np.int32),
                              requant=requant, lo=lo, hi=hi, **p.fields))

    def _finish_avgpool(self, p, y, lo, hi):
        """An AvgPool, unless a window's scale ``s_x / (s_y * count)`` is 1 or more
        (an output scale finer than the input's, as a GlobalAveragePool over a small map
        may get): then, if every window has the same count, the convolution with weights
        ``k`` on the diagonal and a scale of ``1 / k`` of it, which is exact too."""
        x = p.inputs[0]
        op = AvgPool(p.node, x, y, lo=lo, hi=hi, **p.fields)
        counts = sorted(_window_counts(op, self.shapes[x]))
        ratio = self.qp[x].scale / self.qp[y].scale
        top = ratio / counts[0]                      # the largest window scale
        if top < 1:
            self.ops.append(op)
            return
        if len(counts) > 1:
            raise GraphError(p.node, p.op_type, f"window scale {top:g} is "
                             "1 or more, with windows of different sizes: not supported")
        k = 2 ** math.ceil(math.log2(top) + 1e-9)
        if k > 64:
            raise GraphError(p.node, p.op_type, f"window scale {top:g}: 64 or more is not "
                             "supported")
        c = self.shapes[x][0]
        weight = np.zeros((c, c) + tuple(op.kernel), dtype=np.int8)
        weight[np.arange(c), np.arange(c)] = k
        requant = Requant.from_scales(np.full(c, top / k), node=p.node, op=p.op_type)
        self.ops.append(Conv(p.node, x, y, weight, np.zeros(c, np.int32), requant,
                             stride=op.stride, pads=op.pads, lo=lo, hi=hi))
        self.notes.append(f"{p.node}: average (scale {top:.4g}) as a convolution with "
                          f"weights {k} * I")

    def _finish_same(self, p, y, lo, hi):
        """MaxPool, Flatten, Clamp: the output quantisation is the input's, or the op
        is followed by a requantisation (then the op writes a tensor of its own)."""
        x = p.inputs[0]
        qx, qy = self.qp[x], self.qp[y]
        same = (qx.scale, qx.zero_point) == (qy.scale, qy.zero_point)
        if p.cls is Clamp:
            if same:
                self.ops.append(Clamp(p.node, x, y, lo, hi))
            else:
                self._emit_requant(p.node, x, y, lo, hi)
            return
        if same and (lo, hi) == (-128, 127):
            self.ops.append(p.cls(p.node, x, y, **p.fields))
            return
        tmp = f"{p.node}:out"
        self._new_act(tmp, p.shape, _QParams(qx.dtype, qx.scale, qx.zero_point))
        self.ops.append(p.cls(p.node, x, tmp, **p.fields))
        if same:
            self.ops.append(Clamp(f"{p.node}:clamp", tmp, y, lo, hi))
        else:
            self._emit_requant(f"{p.node}:requant", tmp, y, lo, hi)

    def _emit_requant(self, name, x, y, lo, hi):
        """Requantise ``x`` to ``y``'s scale and zero point. The IR has no op for it,
        but two are exact in the tile's arithmetic: VADD of ``x`` with itself,
        ``(x - zp) * (M_a + M_b)``, for scale ratios below 2; else a 1x1 convolution
        (a Dense for vectors) with weights ``k * I`` and a scale of ``ratio / k``."""
        ratio = self.qp[x].scale / self.qp[y].scale
        if ratio < 2:
            mult_a, mult_b, shift = _requant_multipliers(ratio, name)
            self.ops.append(Add(name, x, x, y, mult_a, mult_b, shift, lo, hi))
            how = "an Add of the tensor with itself"
        else:
            k = 2 ** math.ceil(math.log2(ratio) + 1e-9)
            if k > 64:
                raise GraphError(name, "Requantise", f"scale ratio {ratio:g}: requantising "
                                 "by 64 or more is not supported")
            n = self.shapes[x][0]
            eye = (k * np.eye(n)).astype(np.int8)
            requant = Requant.from_scales(np.full(n, ratio / k), node=name, op="Requantise")
            if len(self.shapes[x]) == 3:
                self.ops.append(Conv(name, x, y, eye.reshape(n, n, 1, 1),
                                     np.zeros(n, np.int32), requant, lo=lo, hi=hi))
            else:
                self.ops.append(Dense(name, x, y, eye, np.zeros(n, np.int32), requant,
                                      lo=lo, hi=hi))
            how = f"a 1x1 convolution with weights {k} * I"
        self.notes.append(f"{name}: requantisation {x!r} -> {y!r} (scale ratio "
                          f"{ratio:.4g}) as {how}")

    # ---- clean-up and the result --------------------------------------------------------

    def _prune(self, output):
        """Drop ops the output does not depend on (dead branches)."""
        needed, kept = {output}, []
        for op in reversed(self.ops):
            if op.y in needed:
                kept.append(op)
                needed.update(op_inputs(op))
        dropped = len(self.ops) - len(kept)
        if dropped:
            self.notes.append(f"{dropped} op(s) not needed for the output dropped")
        self.ops = kept[::-1]
        if self.input not in needed:
            raise GraphError(self.graph.name, "Graph", "the output does not depend on the "
                             "input")
        for op in self.ops:
            for t in op_inputs(op):
                if t != self.input and not any(o.y == t for o in self.ops):
                    raise GraphError(op.name, type(op).__name__, f"input {t!r} is not "
                                     "computed from the graph input")

    def _fuse_clamps(self, output):
        """A Clamp whose input only it reads folds into the op that makes the input."""
        readers = {}
        for op in self.ops:
            for t in op_inputs(op):
                readers[t] = readers.get(t, 0) + 1
        producer = {op.y: op for op in self.ops}
        kept = []
        for op in self.ops:
            src = producer.get(op.x) if isinstance(op, Clamp) else None
            if (src is not None and hasattr(src, "lo") and readers[op.x] == 1
                    and op.x != output):
                src.lo, src.hi = max(src.lo, op.lo), min(src.hi, op.hi)
                del self.shapes[src.y]
                src.y = op.y
                producer[op.y] = src
                continue
            kept.append(op)
        self.ops = kept

    def _build(self, output):
        names = {self.input, output}
        for op in self.ops:
            names.update(op_inputs(op))
            names.add(op.y)
        tensors = {}
        for n in sorted(names, key=list(self.shapes).index):
            qp = self.qp[n]
            scale, zp = qp.scale, qp.zero_point
            if scale is None or zp is None:
                self.notes.append(f"{n!r}: quantisation not stated by any node; "
                                  "taken as the integers themselves")
                scale = 1.0 if scale is None else scale
                zp = -_offset(qp.dtype) if zp is None else zp
                qp.scale, qp.zero_point = scale, zp
            tensors[n] = QTensor(n, self.shapes[n], float(scale), int(zp))
        return Graph(self.graph.name or "onnx", tensors, self.ops, self.input, output,
                     self.notes)


def _scale_type(dtype):
    """float16 scales stay float16 (their products are rounded to it); others float32."""
    return np.float16 if dtype == np.float16 else np.float32


def _requant_multipliers(ratio, node):
    """``M_a + M_b = ratio * 2**(31 + S)``, both below 2**31, the largest S (0..31)."""
    if not 0 < ratio < 2:
        raise GraphError(node, "Requantise", f"scale ratio {ratio:g}: requantising by "
                         "2 or more is not supported")
    for shift in range(31, -1, -1):
        total = round(ratio * 2.0**(31 + shift))
        if total <= 2 * (2**31 - 1):
            return int(total - total // 2), int(total // 2), shift
    raise GraphError(node, "Requantise", f"scale ratio {ratio!r} not representable")


def _window_counts(op, shape):
    """The divisors an AvgPool uses over a ``shape`` (C, H, W) input."""
    kh, kw = op.kernel
    if op.count_include_pad:
        return {kh * kw}
    t, l, b, r = op.pads
    _, h, w = shape
    rows = [min(i + kh, t + h) - max(i, t) for i in range(0, h + t + b - kh + 1, op.stride[0])]
    cols = [min(j + kw, l + w) - max(j, l) for j in range(0, w + l + r - kw + 1, op.stride[1])]
    return {a * c for a in rows for c in cols}


def _add_multipliers(ratio_a, ratio_b, node):
    """Q0.31 multipliers of ``ratio_a``, ``ratio_b`` with one common shift 0..31:
    the largest shift keeping both below 2**31 (the most precision).

    Raises
    ------
    GraphError
        If a ratio is 1 or more (an input scale at least the output's).
    """
    top = max(ratio_a, ratio_b)
    if not 0 < top < 1:
        raise GraphError(node, "Add", f"input/output scale ratios {ratio_a:g}, "
                         f"{ratio_b:g}: the tile's VADD needs both below 1")
    for shift in range(31, -1, -1):
        mult_a = round(ratio_a * 2.0**(31 + shift))
        mult_b = round(ratio_b * 2.0**(31 + shift))
        if max(mult_a, mult_b) < 2**31:
            return int(mult_a), int(mult_b), shift
    raise GraphError(node, "Add", f"scale ratio {top!r} rounds to 1: not representable")
