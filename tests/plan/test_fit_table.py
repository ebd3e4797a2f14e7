"""The model-level fit (``npujax fit --table``): known answers, identifiability, never worse,
leave-one-out, and the command's files."""

import csv
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from npujax.cli import main
from npujax.errors import ConfigError
from npujax.frontends.flax import trace_flax
from npujax.hw import fields, load_npu_spec, spec_to_toml
from npujax.ir.passes import optimize
from npujax.models.cnn import DigitsCNN, LeNet, SmallResNet
from npujax.plan import network
from npujax.plan.fit_table import (
    TableModel,
    fit_table,
    one_out_errors,
    predict_model_s,
    read_table,
    table_loss,
)
from npujax.quantize.model_file import save_graph


def _graph(model, shape):
    with jax.numpy_dtype_promotion("standard"):
        return optimize(*trace_flax(model, jnp.zeros(shape, jnp.float32)))


@pytest.fixture(scope="module")
def graphs():
    """Five CNNs of different shapes: compute-, memory- and overhead-heavy layers."""
    r = nnx.Rngs(0)
    return {
        "digits": _graph(DigitsCNN(rngs=r), (1, 8, 8, 1)),
        "digits_wide": _graph(DigitsCNN(rngs=r, width=64, hidden=512), (1, 8, 8, 1)),
        "resnet32": _graph(SmallResNet(rngs=r, in_shape=(32, 32, 3), width=32), (1, 32, 32, 3)),
        "lenet": _graph(LeNet(rngs=r), (1, 28, 28, 1)),
        "lenet64": _graph(LeNet(rngs=r, in_shape=(64, 64, 3), widths=(32, 64)), (1, 64, 64, 3)),
    }


@pytest.fixture(scope="module")
def truth():
    """A device the preset gets wrong: slower DRAM, a slower clock."""
    spec = load_npu_spec("edge_16x16")
    return spec, fields.replace(spec, {"memory.dram_bytes_per_s": 2.0e9,
                                       "array.clock_hz": 7.0e8})


#: the fitted fields of the known-answer and command tests (one compiled program each model)
FIELDS = ["dram_bytes_per_s", "clock_hz", "cpu_ops_per_s"]


def _models(graphs, spec, device):
    out = []
    for name, (g, _) in graphs.items():
        net = network(g, spec)
        m = TableModel(name, "", net.layers, net.chains, 1.0)
        out.append(m._replace(measured_s=predict_model_s(m, device)))
    return out


def test_known_answer_recovered_and_unidentifiable_field_left_alone(graphs, truth):
    """Exact data from a hidden preset: the fields that differ are recovered and predict the
    held-out models exactly; a field no model depends on (the host CPU rate: nothing falls
    back) is reported as not identified and keeps the preset's value."""
    spec, device = truth
    models = _models(graphs, spec, device)
    r = fit_table(models, spec, FIELDS)
    assert r.fitted["memory.dram_bytes_per_s"] == pytest.approx(2.0e9, rel=1e-4)
    assert r.fitted["array.clock_hz"] == pytest.approx(7.0e8, rel=1e-4)
    assert r.identifiable == {"memory.dram_bytes_per_s": True, "array.clock_hz": True,
                              "host.cpu_ops_per_s": False}
    assert r.fitted["host.cpu_ops_per_s"] == spec.host.cpu_ops_per_s
    assert r.not_identified == {"host.cpu_ops_per_s": "no model's time depends on it"}
    assert r.metrics["preset"]["mape"] > 10
    assert r.metrics["loo"]["mape"] < 0.01 and r.metrics["in_sample"]["mape"] < 0.01
    assert r.worst[1] == pytest.approx(1.0, rel=1e-4)
    # each leave-one-out fit recovers the same device from the other models
    assert all(f["memory.dram_bytes_per_s"] == pytest.approx(2.0e9, rel=1e-4)
               for f in r.loo_fitted)


def test_robust_loss_resists_one_gross_outlier(graphs, truth):
    """Exact data from a hidden preset (only its DRAM rate differs) plus one gross outlier: a
    copy of the digits model timed 3x slower (a timed file that is not the architecture
    built). soft_l1 bounds the outlier's pull on the log rate by about ``f |J_o| / sum J_i^2``
    over the clean rows (< 3 % at f = 0.1, ten times less at f = 0.01); least squares is
    pulled about 19 % off by that one row. The clock, which the data leave free, stays at
    the preset's value, i.e. the truth."""
    spec, _ = truth
    device = fields.replace(spec, {"memory.dram_bytes_per_s": 2.0e9})
    models = _models(graphs, spec, device)
    table = [*models, models[0]._replace(name="outlier", measured_s=3 * models[0].measured_s)]
    rate = "memory.dram_bytes_per_s"
    robust = fit_table(table, spec, FIELDS, cross_validate=False)
    assert robust.loss == "soft_l1" and robust.loss_scale == 0.1  # the default
    assert robust.identifiable[rate]
    assert robust.fitted[rate] == pytest.approx(2.0e9, rel=0.03)
    assert robust.fitted["array.clock_hz"] == pytest.approx(device.array.clock_hz, rel=1e-6)
    tight = fit_table(table, spec, FIELDS, cross_validate=False, loss_scale=0.01)
    assert tight.fitted[rate] == pytest.approx(2.0e9, rel=0.005)
    squares = fit_table(table, spec, FIELDS, cross_validate=False, loss="linear")
    assert squares.loss == "linear"
    assert abs(squares.fitted[rate] / 2.0e9 - 1) > 0.15
    # each fit is the minimum of its own loss: the other's values cost it more
    for a, b in ((robust, squares), (squares, robust)):
        ratios = np.log(predict_table(table, b.spec) / b.measured_s)
        assert a.cost["in_sample"] < table_loss(ratios, a.loss, a.loss_scale)


def test_a_field_one_row_carries_is_not_identified():
    """Deletion diagnostics against numpy's least squares: the first parameter is informed by
    every row, the second by row 0 alone. The whole table's Gauss-Newton error of the second
    is as small as the first's (one row pins it exactly), but without row 0 nothing determines
    it; the first's largest error with one row out is the error of the 4-row least squares
    that leaves out its most informative row."""
    rng = np.random.default_rng(0)
    j = np.column_stack([rng.uniform(0.5, 1.0, 5), [1.0, 0, 0, 0, 0]])
    r = rng.normal(0.0, 0.05, 5)
    w = np.ones(5)
    one_out = one_out_errors(r, j, w)
    assert one_out[1] > 1e3
    expect = 0.0
    for i in range(5):
        k = np.delete(np.arange(5), i)
        # without row 0 the second column is zero: the first is a one-parameter fit
        jk = j[k][:, [0]] if i == 0 else j[k]
        # the rows left: residual variance over (rows - parameters), floored at 0.01^2
        s2 = max(float(np.sum(r[k] ** 2)) / (4 - 2), 1e-4)
        expect = max(expect, float(np.sqrt(s2 * np.linalg.inv(jk.T @ jk)[0, 0])))
    assert one_out[0] == pytest.approx(expect, rel=1e-6)
    assert one_out_errors(r[:2], j[:2], w[:2]).tolist() == [np.inf, np.inf]


def predict_table(models, spec):
    return np.asarray([predict_model_s(m, spec) for m in models])


def test_table_loss_known_values_and_errors():
    r = np.array([0.0, 0.1, -1.0])
    assert table_loss(r, "linear") == pytest.approx(1.01)
    # soft_l1: f^2 * 2 (sqrt(1 + (r/f)^2) - 1): 0, 0.02 (sqrt 2 - 1), 0.02 (sqrt 101 - 1)
    assert table_loss(r) == pytest.approx(0.02 * (math.sqrt(2) - 1 + math.sqrt(101) - 1))
    assert table_loss(r, "cauchy", 1.0) == pytest.approx(math.log(1.01) + math.log(2))
    with pytest.raises(ConfigError, match="soft_l1"):
        table_loss(r, "l1")
    with pytest.raises(ConfigError, match="> 0"):
        table_loss(r, "huber", 0.0)


@pytest.mark.parametrize("loss", ["soft_l1", "linear"])
def test_never_worse_than_the_preset(graphs, truth, loss):
    """Fitting a field that cannot explain the data (the vector lanes, where the device
    differs in its DRAM and clock) may not make the table's fit worse, by the fit's own
    loss, than the preset's."""
    spec, device = truth
    models = _models(graphs, spec, device)[:3]
    r = fit_table(models, spec, ["vector.lanes"], cross_validate=False, loss=loss)
    assert r.cost["in_sample"] <= r.cost["preset"] + 1e-12
    if loss == "linear":
        assert r.metrics["in_sample"]["rms_log_err"] <= \
            r.metrics["preset"]["rms_log_err"] + 1e-12
    assert math.isnan(r.loo_s[0])


def test_refuses_too_many_fields_and_too_few_models(graphs, truth):
    spec, device = truth
    models = _models(graphs, spec, device)
    with pytest.raises(ConfigError, match="at most 5"):
        fit_table(models, spec, ["clock_hz", "rows", "cols", "dram_bytes_per_s",
                                 "dram_latency_s", "lanes"])
    with pytest.raises(ConfigError, match="more models than fields"):
        fit_table(models[:2], spec, ["clock_hz", "dram_bytes_per_s"])


def test_the_command_checks_its_fields_before_building_any_model(tmp_path):
    """Too many fields, or one the preset leaves at 0, fail before a row is built (the rows
    here name a file that does not exist: building would skip them, not fail this way)."""
    from npujax.workflows.fit_table import fit_benchmark_table

    table = tmp_path / "t.csv"
    table.write_text("model,source,input_shape,measured_ms\n" + "".join(
        f"m{i},{tmp_path}/absent.onnx,8x8x1,{i + 1}\n" for i in range(8)))
    seen = []
    with pytest.raises(ConfigError, match="at most 5"):
        fit_benchmark_table(table, "edge_16x16", ["clock_hz", "rows", "cols",
                                                 "dram_bytes_per_s", "dram_latency_s",
                                                 "lanes"], progress=seen.append)
    with pytest.raises(ConfigError, match="elementwise_elems_per_s = 0 is outside.*not "
                                          "modelled"):
        fit_benchmark_table(table, "edge_16x16", ["elementwise_elems_per_s"],
                            progress=seen.append)
    assert seen == []


def test_read_table_errors(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("model,measured_ms\nA,-1\n")
    with pytest.raises(ConfigError, match="line 2"):
        read_table(p)
    p.write_text("name,ms\nA,1\n")
    with pytest.raises(ConfigError, match="model and measured_ms"):
        read_table(p)
    p.write_text("model,input_hwc,host,measured_ms,source\nA,224x224x3,usb,2.5,keras:X\n")
    (row,) = read_table(p)
    assert (row.input_hwc, row.group, row.measured_s, row.source) == ((224, 224, 3), "usb",
                                                                        0.0025, "keras:X")
    # a model file named relative to the table is found beside it, wherever the command runs
    p.write_text("model,measured_ms,source\nA,2.5,onnx/a.onnx\nB,3,/abs/b.npz\n")
    assert [r.source for r in read_table(p)] == [str(tmp_path / "onnx" / "a.onnx"), "/abs/b.npz"]


def test_cli_writes_preset_predictions_and_plot(graphs, truth, tmp_path):
    """``npujax fit --table``: rows naming saved models, one without an architecture
    (skipped, listed), two groups picked by --group; the fitted preset reproduces the
    device through ``--npu``."""
    spec, device = truth
    rows = []
    for name, (g, p) in graphs.items():
        path = tmp_path / f"{name}.npz"
        save_graph(path, g, p)
        m = network(g, spec)
        t = predict_model_s(TableModel(name, "", m.layers, m.chains, 1.0), device)
        rows.append({"model": name, "source": str(path), "host": "a", "measured_ms": t * 1e3})
        rows.append({"model": name, "source": str(path), "host": "b", "measured_ms": t * 2e3})
    rows.append({"model": "unknown net", "source": "", "host": "a", "measured_ms": 3.0})
    table = tmp_path / "table.csv"
    with table.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    preset = tmp_path / "start.toml"
    preset.write_text(spec_to_toml(spec))
    out = tmp_path / "fit"
    args = ["fit", "--table", str(table), "--npu", str(preset), "--params", ",".join(FIELDS),
            "--out", str(out), "--no-progress"]
    assert main(args) != 0  # two groups: --group is required
    assert main([*args, "--group", "a"]) == 0
    assert {p.name for p in out.iterdir()} >= {"fitted.toml", "predictions.csv", "fit.json",
                                               "predictions.png"}
    report = json.loads((out / "fit.json").read_text())
    assert report["skipped"][0]["model"] == "unknown net"
    assert (report["loss"]["name"], report["loss"]["scale"]) == ("soft_l1", 0.1)
    assert "loss: soft_l1, scale 0.1" in (out / "fitted.toml").read_text()
    # a field asked for but not identified says why, in the preset and in fit.json
    why = "no model's time depends on it"
    assert f"# host.cpu_ops_per_s kept at the preset: {why}" in (out / "fitted.toml").read_text()
    assert report["fields"]["host.cpu_ops_per_s"]["not_identified_because"] == why
    # --loss and --loss-scale belong to --table
    assert main(["fit", "p.csv", "--model", "m.onnx", "--params", "clock_hz", "--loss",
                 "linear", "--out", str(tmp_path / "x")]) != 0
    # a bad --loss-scale is refused before --out is created
    assert main([*args[:-3], "--out", str(tmp_path / "y"), "--group", "a",
                 "--loss-scale", "0"]) != 0
    assert not (tmp_path / "y").exists()
    assert report["metrics"]["loo"]["mape"] < 0.01
    with (out / "predictions.csv").open() as f:
        pred = list(csv.DictReader(f))
    assert len(pred) == len(graphs)
    assert all(abs(float(r["loo_error_pct"])) < 0.01 for r in pred)
    fitted = load_npu_spec(str(out / "fitted.toml"))
    g = graphs["lenet64"][0]
    m = network(g, fitted)
    assert predict_model_s(TableModel("x", "", m.layers, m.chains, 1.0), fitted) == \
        pytest.approx(float(next(r for r in pred if r["model"] == "lenet64")["measured_ms"])
                      / 1e3, rel=1e-4)


# --- a second device: nothing in the table fit may assume the Coral Edge TPU ---------------


def test_read_table_takes_vendor_shapes(tmp_path):
    """Vendors print batch-1 NCHW (RKNN's model zoo: ``[1, 3, 640, 640]``) or NHWC
    (``[1, 513, 513, 1]``) shapes: both read as height x width x channels; a shape that does
    not say where its channels are, or a batch above 1, is refused with the fix."""
    p = tmp_path / "t.csv"
    p.write_text('model,input_shape,measured_ms\na,"[1, 3, 640, 640]",1\nb,1x513x513x1,2\n'
                 "c,224x224x3,3\n")
    assert [r.input_hwc for r in read_table(p)] == [(640, 640, 3), (513, 513, 1), (224, 224, 3)]
    for bad, match in (("1x3x3x3", "which axis"), ("2x3x64x64", "batch")):
        p.write_text(f"model,input_shape,measured_ms\na,{bad},1\n")
        with pytest.raises(ConfigError, match=match):
            read_table(p)


def _onnx_file(path, *, dynamic, transpose=False):
    """A one-Conv (and optionally ConvTranspose) NCHW ONNX model, 3 -> 8 channels."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    dims = ["n", 3, "h", "w"] if dynamic else [1, 3, 8, 8]
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "k")]
    nodes = [helper.make_node("Conv", ["x", "k"], ["y"], pads=[1, 1, 1, 1])]
    out = "y"
    if transpose:
        inits.append(numpy_helper.from_array(
            rng.standard_normal((8, 4, 2, 2)).astype(np.float32), "kt"))
        nodes.append(helper.make_node("ConvTranspose", ["y", "kt"], ["z"], strides=[2, 2]))
        out = "z"
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      dims)],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return str(path)


def test_zoo_and_onnx_rows_are_built_at_the_rows_shape(tmp_path, monkeypatch):
    """A ``zoo:`` row is built at the row's input shape, as an ONNX row is (it was built at
    the zoo's default shape); an ONNX file fixed at another shape is refused, not costed at
    its own shape."""
    import npujax.models.zoo as zoo
    from npujax.plan.fit_table import TableRow
    from npujax.workflows.fit_table import table_graph

    path = _onnx_file(tmp_path / "dyn.onnx", dynamic=True)
    monkeypatch.setitem(zoo.MODELS, "tiny", zoo.MODELS["ppocr_det"])
    monkeypatch.setattr(zoo, "fetch_model", lambda name, *a, **k: path)
    for src in ("zoo:tiny", path):
        g = table_graph(TableRow("t", src, (16, 24, 3), 1e-3))
        assert g.tensors[g.inputs[0]].shape == (1, 3, 16, 24)
    fixed = _onnx_file(tmp_path / "fixed.onnx", dynamic=False)
    assert table_graph(TableRow("t", fixed, (8, 8, 3), 1e-3)).inputs
    with pytest.raises(ConfigError, match="fixed input"):
        table_graph(TableRow("t", fixed, (16, 16, 3), 1e-3))


def test_table_models_have_no_boundary_conversions_on_any_channel_minor_device(graphs,
                                                                             tmp_path, capsys):
    """A benchmark times the deployed model, whose input arrives in the device's layout. On an
    NC1HWC0 device (RKNN's NC1HWC2) the table's model keeps the device's channel padding but
    not the input/output conversions that ``lower`` charges an NHWC model; an NCHW model with
    a ConvTranspose is built without them too."""
    from npujax.plan.fit_table import TableRow
    from npujax.workflows.fit_table import table_network

    spec = fields.replace(load_npu_spec("edge_16x16"), {
        "layout.activation_layout": "NC1HWC0", "layout.c0": 32, "layout.channel_alignment": 1})
    g, p = graphs["lenet"]
    save_graph(tmp_path / "lenet.npz", g, p)
    plain = network(g, spec).layers
    table = table_network(TableRow("lenet", str(tmp_path / "lenet.npz"), None, 1e-3),
                          spec).layers
    assert any(w.kind == "layout" for w in plain)
    assert not any(w.kind == "layout" for w in table)
    # the same layers at the device's padding (32 channels), less the conversions
    assert sorted((w.op, w.in_elems, w.out_elems) for w in plain if w.kind != "layout") == \
        sorted((w.op, w.in_elems, w.out_elems) for w in table)
    path = _onnx_file(tmp_path / "up.onnx", dynamic=True, transpose=True)
    layers = table_network(TableRow("up", path, (8, 8, 3), 1e-3), spec).layers
    assert [w.op for w in layers if w.kind == "gemm"] == ["Conv", "ConvTranspose"]
    assert not any(w.kind == "layout" for w in layers)
    # `npujax lower --deployed` costs the model the fit costs (without it, the conversions)
    from npujax.plan import lower
    from npujax.workflows.fit_table import deployed_model, table_graph

    fixed = _onnx_file(tmp_path / "fixed.onnx", dynamic=False)
    nhwc = load_npu_spec("edge_16x16")
    want = lower(*deployed_model(table_graph(TableRow("f", fixed, (8, 8, 3), 1e-3)), nhwc))
    times = {}
    capsys.readouterr()
    for flag in ((), ("--deployed",)):
        assert main(["lower", fixed, "--npu", "edge_16x16", "--no-progress", "--format",
                     "json", *flag]) == 0
        times[flag] = json.loads(capsys.readouterr().out)["latency_s"]
    assert times[("--deployed",)] == pytest.approx(want.latency_s, rel=1e-12)
    assert times[()] > times[("--deployed",)]


def test_rows_may_give_fps_and_their_own_width(tmp_path):
    """Vendors publish frames per second and mix widths in one table (RKNN's model zoo: INT8
    and FP16 rows): ``fps`` reads as ``1 / fps`` s, ``dtype``/``bits`` as the row's width,
    which the row's model is then costed at (empty: the fit's width)."""
    import numpy as np

    from npujax.plan.workload import Workload

    p = tmp_path / "t.csv"
    p.write_text("model,fps,dtype\na,500,INT8\nb,250,fp16\nc,100,\n")
    rows = read_table(p)
    assert [r.measured_s for r in rows] == pytest.approx([2e-3, 4e-3, 1e-2])
    assert [r.bits for r in rows] == [8, 16, None]
    p.write_text("model,fps,dtype\na,500,int7\n")
    with pytest.raises(ConfigError, match="dtype 'int7'"):
        read_table(p)
    spec = load_npu_spec("edge_16x16")  # 8-bit operands: a 16-bit layer takes 4 passes
    fc = Workload("fc", "Gemm", "gemm", M=64, K=256, N=256, macs=64 * 256 * 256,
                  weight_elems=256 * 256, in_elems=64 * 256, out_elems=64 * 256)
    m8 = TableModel("fc", "", (fc,), (), 1.0)
    t8, t16 = predict_model_s(m8, spec), predict_model_s(m8._replace(bits=16), spec)
    assert t16 > 2 * t8 and predict_model_s(m8, spec, bits=16) == t16
    assert np.isfinite(t16)


def test_the_report_notes_a_multi_core_preset_that_splits_every_layer():
    """A table is often measured on one core of several (RKNN's "@single_core"): the report
    says so when the preset splits every layer over all its cores, and not otherwise."""
    import numpy as np
    from rich.console import Console

    from npujax.plan.fit_table import TableFitResult, TableRow
    from npujax.workflows.fit_table import TableFitRun, print_table_fit

    one = np.ones(1)
    metric = {"mape": 0.0, "spearman": 1.0, "total_err_pct": 0.0}

    def text(spec):
        r = TableFitResult(spec=spec, fields=(), initial={}, fitted={}, rel_std_err={},
                           identifiable={}, not_identified={}, names=("m",), groups=("",),
                           measured_s=one, preset_s=one, fitted_s=one, loo_s=one, loo_fitted=(),
                           metrics={"preset": metric}, bits=8, loss="soft_l1",
                           loss_scale=0.1, cost={})
        con = Console(record=True, width=200)
        print_table_fit(con, TableFitRun("t.csv", None, (TableRow("m", "x", None, 1.0),), (),
                                         spec, r, ("compute 100%",)))
        return con.export_text()

    three = fields.replace(load_npu_spec("edge_16x16"), {"array.cores": 3})
    assert "cores_per_inference" in text(three)
    assert "cores_per_inference" not in text(
        fields.replace(three, {"array.cores_per_inference": 1}))
