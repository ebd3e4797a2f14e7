"""SCALE-Sim in and out: its config and topologies (conv, GEMM, depthwise) are read, its report
CSVs written with its column names, and the compute report equals SCALE-Sim 3.0.0's own on the
reference cases (tests/systolic/data, made by experiments/scalesim_reference)."""

import json
from pathlib import Path

import numpy as np
import pytest

from npujax.errors import ConfigError
from npujax.systolic.scalesim_io import (
    TopologyLayer,
    read_report,
    read_scalesim_config,
    read_topology,
    write_scalesim_reports,
    write_topology,
)

DATA = Path(__file__).parent / "data"

CFG = """[general]
run_name = {run}

[architecture_presets]
ArrayHeight = {rows}
ArrayWidth = {cols}
IfmapSramSzkB = 1024
FilterSramSzkB = 1024
OfmapSramSzkB = 1024
IfmapOffset = 0
FilterOffset = 10000000
OfmapOffset = 20000000
Bandwidth = 10
Dataflow = {df}

[run_presets]
InterfaceBandwidth = CALC
"""


def _cases(kind):
    cases = json.loads((DATA / f"scalesim_{kind}.json").read_text())["cases"]
    groups = {}
    for c in cases:
        groups.setdefault((c["dataflow"], c["rows"], c["cols"]), []).append(c)
    return groups


@pytest.mark.parametrize("kind", ["gemm", "resnet18", "depthwise"])
def test_compute_report_equals_scalesim(kind, tmp_path):
    for (df, rows, cols), cases in _cases(kind).items():
        cfg = tmp_path / f"{df}{rows}.cfg"
        cfg.write_text(CFG.format(run="t", rows=rows, cols=cols, df=df))
        topo = tmp_path / f"{kind}.csv"
        if kind == "gemm":  # SCALE-Sim's GEMM form
            topo.write_text("Layer, M, N, K,\n" + "".join(
                f"{c['name']}, {c['M']}, {c['N']}, {c['K']},\n" for c in cases))
        else:  # its conv form, depthwise layers named DP... split per channel
            seen, rows_ = set(), []
            for c in cases:
                base = c["name"].split("_ch")[0] if "groups" in c else c["name"]
                if base in seen:
                    continue
                seen.add(base)
                ch = c.get("groups", c["channels"])
                rows_.append(f"{base}, {c['ifmap_h']}, {c['ifmap_w']}, {c['filt_h']}, "
                             f"{c['filt_w']}, {ch}, {c['filters']}, {c['stride']},\n")
            topo.write_text("Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width,"
                            " Channels, Num Filter, Stride,\n" + "".join(rows_))
        config = read_scalesim_config(cfg)
        layers = read_topology(topo)
        assert [(ly.M, ly.K, ly.N) for ly in layers] == [(c["M"], c["K"], c["N"]) for c in cases]
        out = tmp_path / f"out_{df}{rows}"
        approx = set(write_scalesim_reports(layers, config, out).approximate_reads)
        comp = read_report(out / "COMPUTE_REPORT.csv")
        det = read_report(out / "DETAILED_ACCESS_REPORT.csv")
        for row, d, c in zip(comp, det, cases):
            assert row["Total Cycles"] == c["total_cycles"]
            assert row["Total Cycles (incl. prefetch)"] == c["total_cycles_incl_prefetch"]
            assert row["Stall Cycles"] == c["stall_cycles"]
            for col, key in (("Overall Util %", "overall_util_pct"),
                             ("Mapping Efficiency %", "mapping_efficiency_pct"),
                             ("Compute Util %", "compute_util_pct")):
                np.testing.assert_allclose(row[col], c[key], rtol=1e-5)
            assert d["SRAM IFMAP Reads"] == c["sram_ifmap_reads"]
            assert d["SRAM Filter Reads"] == c["sram_filter_reads"]
            assert d["SRAM OFMAP Writes"] == c["sram_ofmap_writes"]
            assert d["DRAM OFMAP Writes"] == c["dram_ofmap_writes"]
            # an operand larger than half its SRAM: npujax gives the compulsory reads, a lower
            # bound of SCALE-Sim's (it re-reads what leaves its active window)
            for col, key in (("DRAM IFMAP Reads", "dram_ifmap_reads"),
                             ("DRAM Filter Reads", "dram_filter_reads")):
                assert d[col] <= c[key] if c["name"] in approx else d[col] == c[key]


def test_topology_round_trip_and_errors(tmp_path):
    layers = [TopologyLayer.conv("c1", 10, 10, 3, 3, 4, 8, 1), TopologyLayer.gemm("fc", 1, 64, 10)]
    write_topology(layers, tmp_path / "t.csv")
    text = (tmp_path / "t.csv").read_text()
    assert all(line.endswith(",") for line in text.splitlines())  # SCALE-Sim drops the last field
    assert read_topology(tmp_path / "t.csv") == layers
    (tmp_path / "bad.csv").write_text("Layer name, a, b, c, d, e, f, g,\nc1, 1, x, 3,\n")
    with pytest.raises(ConfigError, match="line 2"):
        read_topology(tmp_path / "bad.csv")
    (tmp_path / "bad.cfg").write_text(CFG.format(run="r", rows=0, cols=8, df="ws"))
    with pytest.raises(ConfigError, match="ArrayHeight"):
        read_scalesim_config(tmp_path / "bad.cfg")
    with pytest.raises(ConfigError, match="does not exist"):
        read_scalesim_config(tmp_path / "missing.cfg")


def test_cli_topology_then_scalesim_reports(tmp_path):
    """``npujax topology`` writes an ONNX model as a SCALE-Sim topology that ``npujax lower
    --scalesim-config --topology`` reads back and reports on."""
    from onnx import TensorProto, helper, numpy_helper

    from npujax.cli import main

    rng = np.random.default_rng(0)
    k = numpy_helper.from_array(rng.normal(size=(8, 3, 3, 3)).astype(np.float32), "k")
    w = numpy_helper.from_array(rng.normal(size=(8 * 4 * 4, 10)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([0, -1], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["f"]),
             helper.make_node("MatMul", ["f", "w"], ["y"])]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["batch", 3, 8, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["batch", 10])], [k, w, shape])
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
                     .SerializeToString())
    assert main(["topology", str(path), "--out", str(tmp_path / "topo.csv")]) == 0
    layers = read_topology(tmp_path / "topo.csv")
    assert [(ly.M, ly.K, ly.N) for ly in layers] == [(16, 27, 8), (1, 128, 10)]
    assert (layers[0].ifmap_h, layers[0].stride) == (9, 2)  # padded 10, cropped to what is read
    (tmp_path / "a.cfg").write_text(CFG.format(run="r", rows=8, cols=8, df="os"))
    assert main(["lower", "--scalesim-config", str(tmp_path / "a.cfg"), "--topology",
                 str(tmp_path / "topo.csv"), "--out", str(tmp_path / "rep")]) == 0
    comp = read_report(tmp_path / "rep" / "COMPUTE_REPORT.csv")
    assert len(comp) == 2 and comp[0]["Total Cycles"] > 0
    assert main(["lower", "--topology", str(tmp_path / "topo.csv")]) != 0  # needs the config


def test_all_three_reports_equal_scalesim_with_small_srams(tmp_path):
    """Every cell of SCALE-Sim's three reports, on 2 and 4 kB SRAMs where its OFMAP buffer drains
    during compute and operands outgrow their active buffer (experiments/scalesim_reference/
    run_reports.py). The one approximation: the DRAM reads of an operand larger than half its SRAM
    are the compulsory reads (SCALE-Sim re-reads as its sets rotate), so they are a lower bound."""
    runs = json.loads((DATA / "scalesim_reports.json").read_text())["runs"]
    approx_cols = {"DRAM IFMAP Stop Cycle", "DRAM IFMAP Reads", "DRAM Filter Stop Cycle",
                   "DRAM Filter Reads", "Avg IFMAP DRAM BW", "Avg FILTER DRAM BW"}
    exact_cells = approx_rows = 0
    for n, run in enumerate(runs):
        (tmp_path / "a.cfg").write_text(CFG.replace("1024", str(run["sram_kb"])).format(
            run="r", rows=run["rows"], cols=run["cols"], df=run["dataflow"]))
        (tmp_path / "t.csv").write_text(run["topology"])
        layers = read_topology(tmp_path / "t.csv")
        written = write_scalesim_reports(layers, read_scalesim_config(tmp_path / "a.cfg"),
                                         tmp_path / f"o{n}")
        approx_rows += len(written.approximate_reads)
        for name, text in run["reports"].items():
            (tmp_path / "ref.csv").write_text(text)
            ref, ours = read_report(tmp_path / "ref.csv"), read_report(tmp_path / f"o{n}" / name)
            assert [list(r) for r in ours] == [list(r) for r in ref]  # SCALE-Sim's columns
            for layer, r, o in zip(layers, ref, ours):
                for col, v in r.items():
                    if layer.name in written.approximate_reads and col in approx_cols:
                        if col.endswith("Reads"):
                            assert o[col] <= v
                        continue
                    np.testing.assert_allclose(o[col], v, rtol=1e-12, err_msg=f"{name} {col}")
                    exact_cells += 1
    assert exact_cells > 1400 and approx_rows > 0


@pytest.mark.parametrize("flag", [["--npu", "tpu_v1"], ["--dataflow", "os"], ["--batch", "4"],
                                  ["--weight-bits", "4"], ["--format", "json"],
                                  ["--cores", "4"], ["--mapping", "scalesim"]])
def test_scalesim_mode_refuses_model_flags(tmp_path, flag, capsys):
    """The array, dataflow and layers of SCALE-Sim mode come from its config and topology: a
    model-mode flag would do nothing, so it is refused (exit 2) instead of silently ignored."""
    from npujax.cli import main

    (tmp_path / "a.cfg").write_text(CFG.format(run="r", rows=8, cols=8, df="ws"))
    (tmp_path / "t.csv").write_text("Layer, M, N, K,\ng1, 64, 16, 9,\n")
    base = ["lower", "--scalesim-config", str(tmp_path / "a.cfg"), "--topology",
            str(tmp_path / "t.csv"), "--out", str(tmp_path / "rep")]
    assert main([*base, *flag]) == 2
    err = capsys.readouterr().err
    assert flag[0] in err and "SCALE-Sim" in err
    assert not (tmp_path / "rep").exists()
    assert main(base) == 0
