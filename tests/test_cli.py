"""The `fusetile` command line, through main([...])."""

import json
from pathlib import Path

import pytest

from fusetile.kernels.config import TileConfig
from fusetile.hdl import regmap
from fusetile.host import transport as transport_mod
from fusetile.host.transport import register_transport
from fusetile.host.amaranth_sim import AmaranthTransport
from fusetile.host.regmap_docs import markdown, c_header
from fusetile.host.cli import main

from test_transport import StandInTile, RamTransport
from test_device import FakeTile


DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture
def targets(monkeypatch):
    """Test targets: `standin` (Amaranth stand-in), `fake` (Python model), `dead`
    (a bus where nothing answers)."""
    monkeypatch.setattr(transport_mod, "_registry", dict(transport_mod._registry))

    @register_transport("standin")
    class StandIn(AmaranthTransport):
        def __init__(self, config=TileConfig(), **kwargs):
            super().__init__(config, top=StandInTile(config), **kwargs)

    @register_transport("fake")
    class Fake(FakeTile):
        def __init__(self, config=TileConfig()):
            super().__init__(config)

    @register_transport("dead")
    class Dead(RamTransport):
        def __init__(self):
            super().__init__(err_from=0)


def test_regmap_markdown_to_stdout_matches_docs(capsys):
    assert main(["regmap"]) == 0
    out = capsys.readouterr().out
    assert out == markdown(TileConfig())
    assert out == (DOCS / "registers.md").read_text()
    assert main(["regmap", "--markdown"]) == 0
    assert capsys.readouterr().out == out


def test_regmap_c_header_to_file(tmp_path, capsys):
    path = tmp_path / "regs.h"
    assert main(["regmap", "--c-header", "--output", str(path)]) == 0
    assert capsys.readouterr().out == ""
    assert path.read_bytes() == c_header(TileConfig()).encode()
    assert path.read_text() == (DOCS / "fusetile_regs.h").read_text()


def test_regmap_json_and_config(capsys):
    config = TileConfig(kernel_slots=2)
    assert main(["regmap", "--json", "--config", json.dumps({"kernel_slots": 2})]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["config"] == config.as_dict()
    assert sum(w["name"].startswith("KERNEL") for w in data["windows"]) == 2


def test_regmap_bad_config(capsys):
    assert main(["regmap", "--config", '{"rows": 0}']) == 1
    err = capsys.readouterr().err
    assert err == ("fusetile regmap: error: bad configuration '{\"rows\": 0}': "
                   "rows must be between 1 and 64, not 0\n")
    assert main(["regmap", "--config", "/no/such/file.json"]) == 1
    assert "cannot read configuration" in capsys.readouterr().err


def test_info_json_on_stand_in(targets, capsys):
    assert main(["info", "--target", "standin", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    config = TileConfig()
    assert data["target"] == "standin"
    assert data["config"] == config.as_dict()
    assert data["profile_hash"] == config.profile_hash
    assert data["version"] == ".".join(map(str, regmap.VERSION))
    assert data["memory_map"]["CSR"] == regmap.CSR_BASE
    assert data["memory_map"]["GMEM"] == regmap.GMEM_BASE
    assert data["memory_map"]["PLAN[1]"] == regmap.tile_memory_map(config).addr("PLAN[1]")


def test_info_reads_profile_from_the_tile(targets, capsys):
    small = TileConfig(rows=4, cols=4, kernel_slots=2)
    assert main(["info", "-t", "standin", "--json", "--config", json.dumps(small.as_dict())]) == 0
    assert json.loads(capsys.readouterr().out)["config"] == small.as_dict()


def test_info_human_table(targets, capsys):
    assert main(["info", "--target", "fake"]) == 0
    out = capsys.readouterr().out
    assert "fusetile on fake" in out
    assert TileConfig().profile_hash in out
    assert "kernel_slots" in out and "0x00100000" in out


def test_info_unknown_target(capsys):
    assert main(["info", "--target", "nope"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert err.startswith("fusetile info: error: Unknown transport 'nope'; known transports: ")
    assert "amaranth" in err and err.count("\n") == 1


def test_info_tile_not_answering(targets, capsys):
    assert main(["info", "--target", "dead"]) == 1
    err = capsys.readouterr().err
    assert err == ("fusetile info: error: the tile on 'dead' does not answer: "
                   "bus error: read from 0x00000000\n")


def test_every_command_has_json(capsys):
    from fusetile.host.cli import _COMMANDS
    for name in _COMMANDS:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        assert "--json" in capsys.readouterr().out


def test_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2


def test_info_on_real_tile(capsys):
    pytest.importorskip("fusetile.hdl.tile")
    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["target"] == "amaranth" and data["config"] == TileConfig().as_dict()


# -- the adaptive runtime's commands (model target: quick) ---------------------------------

def _json(capsys, argv):
    capsys.readouterr()
    status = main(argv + ["--json"])
    return status, json.loads(capsys.readouterr().out)


def test_bench_workloads_json(capsys):
    status, data = _json(capsys, ["bench", "--target", "model", "--samples", "48"])
    assert status == 0 and data["suite"] == "workloads"
    assert data["hardware"]["profile_hash"] == TileConfig().profile_hash
    rows = {(r["workload"], r["policy"], r["stream"]): r for r in data["results"]}
    assert set(rows) == {(w, p, "shuffled") for w in ("mlp", "cnn", "rescnn", "exit", "moe")
                         for p in ("none", "static", "adaptive")} | \
        {(w, "adaptive", "class-sorted") for w in ("exit", "moe")}
    for r in data["results"]:
        for key in ("inferences", "cycles_per_inference", "gmem_bytes_per_inference",
                    "mac_utilization", "roofline_cycles", "fusions", "defusions",
                    "swap_idle_cycles", "output_mismatches", "warmup_inferences"):
            assert key in r, key
        assert r["output_mismatches"] == 0 and r["target"] == "model"
    assert rows["cnn", "adaptive", "shuffled"]["fusions"] == 1
    for w in ("exit", "moe"):
        for key in ("hits", "misses", "rollbacks", "rollback_cycles", "predictor_accuracy"):
            assert key in rows[w, "adaptive", "shuffled"]["speculation"], key


def test_report_from_a_bench_json(tmp_path, capsys):
    status, data = _json(capsys, ["bench", "--target", "model", "--samples", "48"])
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(data))
    status, paths = _json(capsys, ["report", str(bench), "--out", str(tmp_path / "r")])
    assert status == 0
    for name in ("roofline", "html", "timeline-cnn", "timeline-mlp"):
        path = Path(paths[name])
        assert path.stat().st_size > 1000, name
    page = Path(paths["html"]).read_text()
    assert "fuse</b> conv2+pool2+fc" in page and "timeline-cnn.png" in page
    assert "<h3>moe, class-sorted stream</h3>" in page and "hit rate" in page


def test_report_of_a_tile_without_a_trace(tmp_path, capsys):
    """The iCEBreaker's tile has no trace FIFO: the page says why it has no timelines."""
    config = json.dumps(TileConfig(rows=2, cols=2, word_bytes=4, trace_depth=0).as_dict())
    status, paths = _json(capsys, ["report", "--samples", "8", "--config", config,
                                   "--out", str(tmp_path / "r")])
    assert status == 0 and not any(name.startswith("timeline") for name in paths)
    page = Path(paths["html"]).read_text()
    assert "none: this tile has no trace FIFO" in page and "timeline-" not in page


def test_report_rejects_other_json(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"suite": "isa"}')
    assert main(["report", str(bad), "--out", str(tmp_path)]) == 1
    assert "is not the JSON of 'fusetile bench" in capsys.readouterr().err


def test_demo_digits_on_the_model(tmp_path, capsys):
    status, data = _json(capsys, ["demo", "--target", "model", "--samples", "48",
                                  "--out", str(tmp_path / "r")])
    assert status == 0 and data["workload"] == "cnn"
    assert [r["policy"] for r in data["results"]] == ["none", "static", "adaptive"]
    assert Path(data["report"]["timeline-cnn"]).exists()


def test_run_adaptive_with_a_cache(tmp_path, capsys):
    import numpy as np
    from fusetile.workloads.digits import load_split
    x = tmp_path / "x.npy"
    np.save(x, load_split()[2][:64])
    argv = ["run", str(Path(__file__).parents[1] / "workloads" / "digits_cnn.onnx"),
            "--input", str(x), "--target", "model", "--policy", "adaptive",
            "--cache", str(tmp_path / "c.sqlite")]
    status, first = _json(capsys, argv)
    assert status == 0 and first["fusions"] == 1 and first["units"][-1] == "conv2+pool2+fc"
    status, second = _json(capsys, argv)
    assert second["jit_compiles"] == 0 and second["fusions"] == 0
    assert second["units"] == first["units"]
    # the MLP, one kernel under the static rules: its weights stay in the scratchpad
    argv[1] = argv[1].replace("digits_cnn", "digits_mlp")
    status, mlp = _json(capsys, argv)
    assert status == 0 and mlp["units"] == ["fc1+fc2"] and mlp["resident_constants"]
    assert [e["action"] for e in mlp["fusion_log"]] == ["resident"]


def test_run_adaptive_speculates_on_a_mixture_of_experts(tmp_path, capsys):
    import numpy as np
    from fusetile.workloads.digits import load_split
    x, y = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(x, load_split()[2][:48])
    model = str(Path(__file__).parents[1] / "workloads" / "digits_moe.onnx")
    runs = {}
    for policy in ("static", "adaptive"):
        status, runs[policy] = _json(capsys, ["run", model, "--input", str(x), "--output",
                                              str(y), "--target", "model", "--policy", policy])
        assert status == 0
        runs[policy]["y"] = np.load(y)
    spec = runs["adaptive"]["speculation"]
    assert runs["adaptive"]["lanes"] == 1 and spec["hits"] > 0
    assert spec["rollbacks"] == spec["misses"]
    assert np.array_equal(runs["adaptive"]["y"], runs["static"]["y"])
