"""End to end: the shipped digits workloads through ``fusetile run`` agree with
onnxruntime; Verilator agrees with the golden model bit for bit; ``static`` beats
``none`` on the CNN by the tile's counters."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from fusetile.host.cli import main
from fusetile.workloads import digits

from conftest import require_simulator



def _path(name):
    from pathlib import Path
    return str(Path(digits.__file__).with_name(f"digits_{name}.onnx"))


@pytest.fixture(scope="module")
def split():
    return digits.load_split()


def _ort(path, xs):
    sess = digits.session(path)
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[None]})[0] for x in xs])


def _run(tmp_path, capsys, path, xs, *extra):
    x_file, y_file = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(x_file, xs)
    capsys.readouterr()
    status = main(["run", path, "--input", str(x_file), "--output", str(y_file), "--json",
                   *extra])
    assert status in (0, None)
    return np.load(y_file), json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", ["mlp", "cnn", "rescnn"])
def test_model_target_matches_onnxruntime(tmp_path, capsys, split, name):
    """Every output within one quantisation step of onnxruntime's, >= 99.9 % identical,
    and the same accuracy on the held-out digits (within 0.5 points)."""
    _, _, x_test, y_test = split
    path = _path(name)
    y, report = _run(tmp_path, capsys, path, x_test, "--target", "model")
    expected = _ort(path, x_test)
    step = np.abs(np.diff(np.unique(expected))).min()
    steps = np.abs(y.reshape(expected.shape) - expected) / step
    assert steps.max() <= 1 + 1e-4
    assert (steps < 0.5).mean() >= 0.999
    tile_acc = (y.reshape(len(y), -1).argmax(1) == y_test).mean()
    ort_acc = (expected.argmax(1) == y_test).mean()
    assert abs(tile_acc - ort_acc) <= 0.005
    assert report["samples"] == len(x_test) and report["target"] == "model"
    for key in ("cycles_per_inference", "gmem_bytes_per_inference", "macs_per_inference",
                "mac_utilization"):
        assert report[key] > 0


@pytest.mark.cocotb
def test_verilator_is_bit_identical_and_static_beats_none(tmp_path, capsys, split):
    require_simulator("verilator")
    xs = split[2][:16]
    path = _path("cnn")
    reports = {}
    for policy in ("none", "static"):
        y_model, _ = _run(tmp_path, capsys, path, xs, "--target", "model", "--policy", policy)
        y_rtl, reports[policy] = _run(tmp_path, capsys, path, xs, "--target", "verilator",
                                      "--policy", policy)
        assert np.array_equal(y_rtl, y_model)
    assert reports["static"]["cycles_per_inference"] < reports["none"]["cycles_per_inference"]
    assert reports["static"]["gmem_bytes_per_inference"] < \
        reports["none"]["gmem_bytes_per_inference"]


def test_unsupported_op_names_the_node(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], name="the_softmax")], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "softmax.onnx"
    onnx.save(model, path)
    np.save(tmp_path / "x.npy", np.zeros((2, 4), np.float32))
    status = main(["run", str(path), "--input", str(tmp_path / "x.npy")])
    assert status not in (0, None)
    err = capsys.readouterr().err
    assert "the_softmax" in err and "Softmax" in err
