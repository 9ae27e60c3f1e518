"""ONNX backend node tests of the integer ops, through the importer and the IR.

:func:`node_tests` picks the cases of onnx's own backend test suite that exercise what
the tile computes (QLinearMatMul, QLinearConv, MatMulInteger, ConvInteger);
:func:`run_node_test` imports one with :func:`~fusetile.host.onnx_import.load_model`,
runs it with a *runner* (by default the IR's bit-exact reference, sample by sample)
and compares with the expected outputs exactly.

How a node test becomes a tile graph:

* Every input but the first (weights, scales, zero points, bias) becomes a constant
  with the test's value: the tile takes them at compile time, not at run time.
* A 2-D or 4-D first input of ``N`` rows/images is ``N`` samples of batch size 1.
* uint8 inputs and outputs are shifted by 128 to and from the IR's int8 domain.

What the IR cannot express comes out as ``unsupported`` with the importer's
:class:`~fusetile.kernels.graph.GraphError` message, never as a wrong answer. As it
happens, every upstream case of these ops is unsupported (int32 outputs, weight zero
points that do not fold into int8, 3-D batched matmuls): :func:`tile_variants` derives
from the QLinear cases ones with tile-compatible weights (the same values, the weight
zero point replaced by 0, or 128 for uint8) whose expected outputs come from onnx's
reference implementation (:class:`onnx.reference.ReferenceEvaluator`), the code that
made the upstream outputs.
"""

import copy
import dataclasses
import glob
import os
import warnings
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import onnx
from onnx import numpy_helper

from ..kernels.graph import GraphError, run_reference
from .onnx_import import load_model


__all__ = ["NODE_TEST_OPS", "NodeTestResult", "node_tests", "tile_variants",
           "run_node_test", "reference_runner", "results_table"]


#: Substrings of the names of the node tests that exercise the tile's integer ops.
NODE_TEST_OPS = ("qlinearmatmul", "qlinearconv", "matmulinteger", "convinteger")


@dataclass
class NodeTestResult:
    """The outcome of one node test: ``status`` is ``"pass"``, ``"fail"`` or
    ``"unsupported"``; ``message`` says why (the GraphError for unsupported)."""
    name: str
    status: str
    message: str = ""


@lru_cache(maxsize=1)
def _all_node_tests():
    # Generating the suite's data runs every case's numpy code; some overflow on
    # purpose (RuntimeWarning), which says nothing about the cases used here.
    from onnx.backend.test.loader import load_model_tests
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return tuple(load_model_tests(kind="node"))


def node_tests():
    """The onnx backend node test cases of the tile's integer ops, in memory.

    Returns
    -------
    list of onnx.backend.test.case.test_case.TestCase
    """
    return [c for c in _all_node_tests() if any(op in c.name for op in NODE_TEST_OPS)]


def tile_variants(cases=None):
    """Cases derived from the node tests so that the tile can run them, with expected
    outputs recomputed by onnx's reference implementation:

    * ``<name>_tile_weights``, from QLinearMatMul/QLinearConv: the weight zero point
      becomes 0 (int8) or 128 (uint8); the weights and all else stay.
    * ``<name>_requantised``, from MatMulInteger/ConvInteger: the int32 result goes
      through ``Cast -> Mul -> QuantizeLinear`` to int8.
    """
    out = []
    for case in node_tests() if cases is None else cases:
        model, data_sets = _load_case(case)
        op = model.graph.node[0].op_type if len(model.graph.node) == 1 else None
        if op in ("QLinearMatMul", "QLinearConv"):
            out.append(_variant(case, f"{case.name}_tile_weights", model,
                                [_symmetric_weights(inputs) for inputs, _ in data_sets]))
        elif op in ("MatMulInteger", "ConvInteger"):
            out.append(_variant(case, f"{case.name}_requantised", _requantised(model),
                                [list(inputs) for inputs, _ in data_sets]))
    return out


def _variant(case, name, model, input_sets):
    from onnx.reference import ReferenceEvaluator
    evaluator = ReferenceEvaluator(model)
    data_sets = []
    for inputs in input_sets:
        feeds = {i.name: v for i, v in zip(model.graph.input, inputs)}
        data_sets.append((inputs, evaluator.run(None, feeds)))
    return dataclasses.replace(case, name=name, model_dir=None, model=model,
                               data_sets=data_sets)


def _symmetric_weights(inputs):
    """QLinearMatMul/QLinearConv inputs with the weight (input 3) zero point (input 5)
    made the tile's: 0 for int8, 128 for uint8."""
    inputs = list(inputs)
    zp = np.asarray(inputs[5])
    inputs[5] = np.full_like(zp, 128 if np.asarray(inputs[3]).dtype == np.uint8 else 0)
    return inputs


def _requantised(model):
    """``model`` (one integer op, int32 output) followed by Cast, Mul and an int8
    QuantizeLinear. The scales are not round numbers, so that exact ties (where float
    arithmetic and the tile's fixed point may round differently) do not occur."""
    from onnx import TensorProto, helper
    model = copy.deepcopy(model)
    g = model.graph
    acc = g.output[0].name
    g.node.extend([
        helper.make_node("Cast", [acc], ["acc_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["acc_float", "acc_scale"], ["real"]),
        helper.make_node("QuantizeLinear", ["real", "y_scale", "y_zero_point"], ["y_int8"]),
    ])
    g.initializer.extend([
        numpy_helper.from_array(np.array(0.0391, np.float32), "acc_scale"),
        numpy_helper.from_array(np.array(0.0473, np.float32), "y_scale"),
        numpy_helper.from_array(np.array(-3, np.int8), "y_zero_point")])
    shape = [d.dim_value for d in g.output[0].type.tensor_type.shape.dim]
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("y_int8", TensorProto.INT8, shape))
    return model


def reference_runner(graph, int_inputs):
    """The default runner: :func:`run_reference`, one sample at a time.

    Parameters
    ----------
    graph : Graph
    int_inputs : int8 array ``(samples, *input shape)``

    Returns
    -------
    int8 array ``(samples, *output shape)``
    """
    return np.stack([run_reference(graph, x)[graph.output] for x in int_inputs])


def run_node_test(case, runner=reference_runner):
    """Import one node test, run every data set with ``runner``, compare exactly.

    Parameters
    ----------
    case : TestCase
        From :func:`node_tests` or :func:`tile_variants` (in memory, or on disk in
        ``case.model_dir`` with ``test_data_set_*/{input,output}_*.pb``).
    runner : callable
        ``runner(graph, int_inputs) -> int_outputs`` on int8 arrays of samples.

    Returns
    -------
    NodeTestResult
    """
    model, data_sets = _load_case(case)
    for index, (inputs, outputs) in enumerate(data_sets):
        try:
            graph, samples = _tile_graph(model, inputs)
        except GraphError as exc:
            return NodeTestResult(case.name, "unsupported", str(exc))
        if len(outputs) != 1:
            return NodeTestResult(case.name, "unsupported", f"{len(outputs)} outputs")
        x = _to_int8(np.asarray(inputs[0]))
        x = x.reshape((samples,) + graph.tensors[graph.input].shape)
        got = np.asarray(runner(graph, x)).astype(np.int64)
        want = np.asarray(outputs[0])
        if want.dtype not in (np.int8, np.uint8):
            return NodeTestResult(case.name, "fail", f"expected output of type "
                                  f"{want.dtype}, but the graph imported")
        want = _to_int8(want).astype(np.int64).reshape(got.shape)
        if not np.array_equal(got, want):
            bad = int(np.sum(got != want))
            return NodeTestResult(case.name, "fail", f"data set {index}: {bad} of "
                                  f"{want.size} values differ (max "
                                  f"{int(np.abs(got - want).max())})")
    return NodeTestResult(case.name, "pass", f"{len(data_sets)} data set(s) exact")


def results_table(results):
    """A Markdown table of :class:`NodeTestResult`\\ s."""
    rows = ["| node test | status | message |", "|---|---|---|"]
    rows += [f"| {r.name} | {r.status} | {r.message.replace('|', '/')} |" for r in results]
    return "\n".join(rows)


# -- helpers ------------------------------------------------------------------------------

def _load_case(case):
    """(model, [(inputs, outputs), ...]) of a case in memory or on disk."""
    if case.model is not None:
        return case.model, list(case.data_sets)
    model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
    data_sets = []
    for folder in sorted(glob.glob(os.path.join(case.model_dir, "test_data_set_*"))):
        data_sets.append(tuple([_read_pb(p) for p in sorted(glob.glob(
            os.path.join(folder, f"{kind}_*.pb")), key=_pb_index)]
                               for kind in ("input", "output")))
    return model, data_sets


def _pb_index(path):
    return int(os.path.basename(path).split("_")[1].split(".")[0])


def _read_pb(path):
    tensor = onnx.TensorProto()
    with open(path, "rb") as f:
        tensor.ParseFromString(f.read())
    return numpy_helper.to_array(tensor)


def _tile_graph(model, inputs):
    """Freeze all inputs but the first as constants, make the first's leading
    dimension (its samples) 1, and import. Returns (graph, number of samples)."""
    model = copy.deepcopy(model)
    g = model.graph
    x = np.asarray(inputs[0])
    for vi, value in list(zip(g.input, inputs))[1:]:
        g.initializer.append(numpy_helper.from_array(np.asarray(value), vi.name))
    del g.input[1:]
    del g.value_info[:]
    samples = 1
    if x.ndim in (2, 4):
        samples = x.shape[0]
        for vi in list(g.input) + list(g.output):
            dims = vi.type.tensor_type.shape.dim
            if len(dims) == x.ndim and dims[0].HasField("dim_value") and \
                    dims[0].dim_value == samples:
                dims[0].dim_value = 1
    return load_model(model), samples


def _to_int8(a):
    """uint8 -> int8 by subtracting 128 (exact); int8 unchanged."""
    a = np.asarray(a)
    if a.dtype == np.uint8:
        return (a.astype(np.int16) - 128).astype(np.int8)
    return a
