"""onnx's backend node tests of the integer ops, through the importer and the IR
reference (:mod:`fusetile.host.conformance`): nothing may fail; what the IR cannot
express is unsupported, with the importer's reason."""

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from fusetile.host.conformance import (NODE_TEST_OPS, node_tests, reference_runner,
                                       results_table, run_node_test, tile_variants)


@pytest.fixture(scope="module")
def upstream():
    return {r.name: r for r in map(run_node_test, node_tests())}


@pytest.fixture(scope="module")
def variants():
    return {r.name: r for r in map(run_node_test, tile_variants())}


def test_cases_found():
    names = [c.name for c in node_tests()]
    for op in NODE_TEST_OPS:
        assert any(op in n for n in names), op
    assert all(any(op in n for op in NODE_TEST_OPS) for n in names)


def test_nothing_fails(upstream, variants):
    results = {**upstream, **variants}
    bad = [r for r in results.values() if r.status not in ("pass", "unsupported")]
    assert not bad, results_table(bad)


def test_unsupported_says_why(upstream, variants):
    """Every unsupported case carries a GraphError message: node, op, reason."""
    for r in [*upstream.values(), *variants.values()]:
        if r.status == "unsupported":
            assert r.message.startswith("node '") and "): " in r.message, r


def test_upstream_results(upstream):
    """Pins which upstream cases pass (QLinearConv and the 2-D QLinearMatMuls, whose
    weight zero points need two int8 weight planes) and why the rest are unsupported
    (int32 outputs, batched 3-D matmuls), so a change is noticed."""
    for name, r in upstream.items():
        if "integer" in name:
            assert r.status == "unsupported" and "int32 output not supported" in r.message
        elif "_3D_" in name:
            assert r.status == "unsupported" and "shape [2, 2, 4]" in r.message
        else:
            assert r.status == "pass", r
    assert sum(r.status == "pass" for r in upstream.values()) == 5


def tile_runner(graph, int_inputs):
    """The compiled graph on the golden model (``model`` target)."""
    from fusetile.host import open_transport
    from fusetile.host.device import Device
    from fusetile.host.runner import infer, load_program
    from fusetile.kernels.compiler import compile_graph
    from fusetile.kernels.config import TileConfig
    with open_transport("model") as transport:
        dev = Device(transport)
        program = compile_graph(graph, TileConfig(), policy="static")
        load_program(dev, program)
        return infer(dev, program, int_inputs)[0]


def test_upstream_passes_on_the_tile(upstream):
    """The upstream cases that pass on the reference pass compiled, on the tile's golden
    model, too."""
    cases = {c.name: c for c in node_tests()}
    for name, r in upstream.items():
        if r.status == "pass":
            assert run_node_test(cases[name], tile_runner).status == "pass", name


def test_qlinear_ops_pass(variants):
    passed = [n for n, r in variants.items() if r.status == "pass"]
    for op in NODE_TEST_OPS:
        assert any(op in n for n in passed), (op, results_table(variants.values()))
    # the 2-D QLinearMatMul ones, float32 and float16 scales, int8 and uint8
    assert sum("qlinearmatmul_2D" in n for n in passed) == 4


def test_a_wrong_runner_fails():
    """The comparison is exact: a runner off by one in one value fails the case."""
    def off_by_one(graph, x):
        y = reference_runner(graph, x).astype(np.int16)
        y.flat[0] += 1 if y.flat[0] < 127 else -1
        return y.astype(np.int8)
    case = next(c for c in tile_variants() if "qlinearconv" in c.name)
    result = run_node_test(case, off_by_one)
    assert result.status == "fail" and "1 of 49 values differ" in result.message


def test_case_on_disk(tmp_path):
    """A case stored as onnx stores them: model.onnx, test_data_set_*/{input,output}_*.pb."""
    case = next(c for c in tile_variants() if "qlinearmatmul_2D_int8_float32" in c.name)
    onnx.save(case.model, tmp_path / "model.onnx")
    for i, (inputs, outputs) in enumerate(case.data_sets):
        folder = tmp_path / f"test_data_set_{i}"
        folder.mkdir()
        for kind, arrays in (("input", inputs), ("output", outputs)):
            for j, a in enumerate(arrays):
                (folder / f"{kind}_{j}.pb").write_bytes(
                    numpy_helper.from_array(np.asarray(a)).SerializeToString())
    on_disk = dataclasses.replace(case, model=None, data_sets=None, model_dir=str(tmp_path))
    assert run_node_test(on_disk).status == "pass"
