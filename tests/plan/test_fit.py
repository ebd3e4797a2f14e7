"""``npujax fit`` pieces that need no compiled fit: profile readers, name matching, field names
and ranges, the metrics, the preset writer and the fit's argument checks. The known-answer fit
itself is in tests/integration/test_fit_known_answer.py."""

import json

import numpy as np
import pytest

from npujax.errors import ConfigError
from npujax.hw import fields
from npujax.ir.graph import Graph, Node, TensorType
from npujax.plan.fit import (
    FITTABLE,
    FitConfig,
    fit_metrics,
    fit_spec,
    op_class,
    resolve_fields,
)
from npujax.plan.profile import (
    Profile,
    match_profile,
    read_ort_profile,
    read_profile,
    read_profile_csv,
)
from npujax.plan.workload import Workload


def test_csv_profile_takes_medians_and_reads_lower_layers_csv(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text("layer,latency_s,extra\nconv1,1e-3,x\nconv1,3e-3,y\nconv1,2e-3,z\nfc,5e-6,w\n")
    prof = read_profile_csv(p)
    assert prof.names == ("conv1", "fc")
    np.testing.assert_allclose(prof.latency_s, [2e-3, 5e-6])
    assert list(prof.runs) == [3, 1] and prof.format == "csv"
    q = tmp_path / "layers.csv"  # the 'name' column of `npujax lower --out`
    q.write_text("name,op,latency_s\nstem,Conv,4e-6\n")
    assert read_profile(q).names == ("stem",)


@pytest.mark.parametrize("text, message", [
    ("name_of_layer,seconds\na,1\n", "layer,latency_s"),
    ("layer,latency_s\na,fast\n", "not a number"),
    ("layer,latency_s\na,-1\n", "negative"),
    ("layer,latency_s\n", "no measurements"),
])
def test_csv_profile_errors_name_the_problem(tmp_path, text, message):
    p = tmp_path / "p.csv"
    p.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_profile(p)


def test_missing_profile_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        read_profile(tmp_path / "nope.csv")


def _ort_events(runs):
    ev = [{"cat": "Session", "name": "session_initialization", "dur": 900, "ph": "X"}]
    for k in range(runs):
        ev.append({"cat": "Session", "name": "model_run", "dur": 1000, "ph": "X"})
        ev.append({"cat": "Node", "name": "Conv@0_fence_before", "dur": 0, "ph": "X"})
        ev.append({"cat": "Node", "name": "Conv@0_kernel_time", "dur": 100 + 10 * k, "ph": "X",
                   "args": {"op_name": "Conv"}})
        ev.append({"cat": "Node", "name": "Relu@0_kernel_time", "dur": 7, "ph": "X"})
    return ev


def test_onnxruntime_profile_reads_kernel_times_in_microseconds(tmp_path):
    p = tmp_path / "onnxruntime_profile.json"
    p.write_text(json.dumps(_ort_events(5)))
    prof = read_profile(p)
    assert prof.format == "onnxruntime" and prof.names == ("Conv@0", "Relu@0")
    np.testing.assert_allclose(prof.latency_s, [120e-6, 7e-6])  # median of 100..140 us
    assert list(prof.runs) == [5, 5]
    assert read_ort_profile(p).names == prof.names


def test_onnxruntime_profile_without_node_events_is_an_error(tmp_path):
    p = tmp_path / "prof.json"
    p.write_text(json.dumps([{"cat": "Session", "name": "model_run", "dur": 3}]))
    with pytest.raises(ConfigError, match="no node events"):
        read_profile(p)


def _raw_graph():
    """x -> Conv@0 -> BatchNormalization@0 -> Relu@0 -> Reshape@0 -> Gemm@0 -> y"""
    t = TensorType((1, 4), "float32")
    chain = ["Conv@0", "BatchNormalization@0", "Relu@0", "Reshape@0", "Gemm@0"]
    nodes, prev = [], "x"
    for i, name in enumerate(chain):
        out = f"t{i}"
        nodes.append(Node(name, name.split("@")[0], (prev,), (out,)))
        prev = out
    tensors = {"x": t, **{f"t{i}": t for i in range(len(chain))}}
    return Graph(tuple(nodes), ("x",), (prev,), tensors)


def _layers():
    return [Workload("Conv@0", "Conv", "gemm", M=4, K=4, N=4, macs=64),
            Workload("Gemm@0", "Gemm", "gemm", M=1, K=4, N=4, macs=16),
            Workload("Add@9", "Add", "vector", vector_ops=4)]


def test_folded_and_fused_nodes_are_summed_into_the_layer_that_absorbed_them():
    prof = Profile.from_samples({"Conv@0": [10e-6], "BatchNormalization@0": [2e-6],
                                 "Relu@0": [1e-6], "Reshape@0": [0.5e-6],
                                 "Gemm@0/MatMulAddFusion": [3e-6]}, "<t>", "onnxruntime")
    m = match_profile(prof, _layers(), _raw_graph())
    assert list(m.layer_index) == [0, 1]
    np.testing.assert_allclose(m.measured_s, [13.5e-6, 3e-6])
    assert m.names[0] == ("Conv@0", "BatchNormalization@0", "Relu@0", "Reshape@0")
    assert m.unmeasured == ("Add@9",) and m.skipped == ()


def test_unmatched_names_fail_or_are_skipped_and_listed():
    prof = Profile.from_samples({"Conv@0": [1e-6], "Softmax@7": [1e-6]}, "<t>", "csv")
    with pytest.raises(ConfigError, match="Softmax@7.*--skip-unmatched"):
        match_profile(prof, _layers(), _raw_graph())
    m = match_profile(prof, _layers(), _raw_graph(), on_unmatched="skip")
    assert m.skipped == ("Softmax@7",) and list(m.layer_index) == [0]
    with pytest.raises(ConfigError, match="no profile name"):
        match_profile(Profile.from_samples({"zz": [1.0]}, "<t>", "csv"), _layers(),
                      on_unmatched="skip")


def test_field_names_resolve_short_and_full_and_reject_the_rest():
    assert resolve_fields(["clock_hz", "memory.dram_bytes_per_s", " lanes"]) == (
        "array.clock_hz", "memory.dram_bytes_per_s", "vector.lanes")
    for bad, message in ((["c0"], "cannot fit"), (["clock_hz", "array.clock_hz"], "twice"),
                         ([], "at least one")):
        with pytest.raises(ConfigError, match=message):
            resolve_fields(bad)


def test_fittable_fields_are_traced_with_positive_log_ranges():
    for f in FITTABLE:  # fitted as data inside one program, so they must not change workloads
        assert fields.is_traced(f), f
        lo, hi = fields.log_range(f)
        assert 0 < lo < hi
    assert fields.log_range("array.clock_hz") == (1e3, 1e11)
    assert fields.log_range("memory.dram_latency_s") == (1e-9, 1.0)  # may be 0: hi x 1e-9


def test_op_classes():
    assert [op_class(w) for w in _layers()] == ["conv", "matmul", "vector"]
    assert op_class(Workload("d", "Conv", "gemm", groups=8)) == "depthwise"
    assert op_class(Workload("c", "Softmax", "vector", device="cpu")) == "cpu"
    assert op_class(Workload("x:in", "ToNHWC", "layout")) == "layout"


def test_metrics_known_values():
    m = fit_metrics(np.array([1.0, 2.0, 4.0]), np.array([1.1, 1.8, 4.0]))
    assert m["mape"] == pytest.approx((10 + 10 + 0) / 3)
    assert m["spearman"] == pytest.approx(1.0)
    assert m["total_err_pct"] == pytest.approx((6.9 / 7 - 1) * 100)
    assert fit_metrics(np.array([1.0, 2.0]), np.array([2.0, 1.0]))["spearman"] == pytest.approx(-1)


def test_fit_rejects_bad_inputs_before_compiling(edge_spec):
    layers = _layers()
    good = dict(layer_index=np.array([0, 1]), measured_s=np.array([1e-6, 2e-6]))
    cases = [
        (dict(good, measured_s=np.array([1e-6, 0.0])), "> 0 seconds"),
        (dict(good, layer_index=np.array([0, 7])), "index"),
        (dict(good, measured_s=np.array([1e-6])), "equal"),
    ]
    for kw, message in cases:
        with pytest.raises(ConfigError, match=message):
            fit_spec(layers, edge_spec, kw["layer_index"], kw["measured_s"], ["clock_hz"])
    with pytest.raises(ConfigError, match="outside its fit range"):
        fit_spec(layers, edge_spec, **good, fields=["clock_hz"],
                 config=FitConfig(bounds={"array.clock_hz": (2e9, 3e9)}))
    with pytest.raises(ConfigError, match="not fitted"):
        fit_spec(layers, edge_spec, **good, fields=["clock_hz"],
                 config=FitConfig(bounds={"memory.dram_bytes_per_s": (1e9, 1e10)}))
    with pytest.raises(ConfigError, match="config must be a FitConfig"):
        fit_spec(layers, edge_spec, **good, fields=["clock_hz"],
                 config={"steps": 3})  # type: ignore[arg-type]


@pytest.mark.parametrize("fields, message", [
    (dict(steps=0), r"FitConfig.steps must be an int >= 1, got 0; pass"),
    (dict(steps=2.0), r"FitConfig.steps .* got 2.0"),
    (dict(chunk=0), r"FitConfig.chunk must be an int >= 1, got 0"),
    (dict(bits=0), r"FitConfig.bits must be a width in \[1, 64\], got 0"),
    (dict(bits=65), r"FitConfig.bits .* got 65"),
    (dict(learning_rate=0.0), r"FitConfig.learning_rate must be a finite number > 0, got 0.0"),
    (dict(learning_rate=float("inf")), r"FitConfig.learning_rate .* got inf"),
    (dict(regularization=-1e-3), r"FitConfig.regularization must be .* >= 0, got -0.001"),
    (dict(temperature=0.0), r"FitConfig.temperature must be in \(0, 10\], got 0.0"),
    (dict(efficiency="yes"), r"FitConfig.efficiency must be True or False, got 'yes'"),
    (dict(name=3), r"FitConfig.name must be a preset name"),
    (dict(bounds={"array.clock_hz": (1e9, 1e2)}), r"bounds of array.clock_hz .* lo < hi"),
    (dict(bounds={"clock_hz": (1e9,)}), r"FitConfig.bounds\['clock_hz'\] must be a pair"),
    (dict(bounds={"c0": (1.0, 2.0)}), r"FitConfig.bounds: cannot fit 'c0'"),
    (dict(bounds={"clock_hz": (1e8, 1e9), "array.clock_hz": (1e8, 1e9)}), r"twice"),
    (dict(bounds=[("clock_hz", (1e8, 1e9))]), r"FitConfig.bounds must be a mapping"),
])
def test_fit_config_names_the_field_the_value_and_the_fix(fields, message):
    with pytest.raises(ConfigError, match=message):
        FitConfig(**fields)


def test_fit_config_is_frozen_keyword_only_with_read_only_full_name_bounds():
    import dataclasses

    c = FitConfig(bounds={"clock_hz": (1e8, 5e9)}, steps=30)
    assert dict(c.bounds) == {"array.clock_hz": (1e8, 5e9)}
    with pytest.raises(TypeError):
        c.bounds["array.clock_hz"] = (1.0, 2.0)  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.steps = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        FitConfig(True)  # type: ignore[misc]
    assert hash(c) == hash(dataclasses.replace(c)) and c == dataclasses.replace(c)
    assert FitConfig() == FitConfig(efficiency=False, overhead=False, bounds=None, steps=400,
                                    learning_rate=0.1, regularization=1e-3, temperature=0.05,
                                    chunk=50, bits=8, name=None)


@pytest.mark.parametrize("extra, message", [
    (["--params", "c0"], "cannot fit 'c0'"),
    (["--params", "clock_hz", "--bound", "clock_hz=1e8"], "FIELD=LO:HI"),
    (["--params", "clock_hz", "--learning-rate", "0"], "learning-rate"),
])
def test_cli_rejects_bad_options_in_one_line_before_loading_anything(tmp_path, capsys, extra,
                                                                     message):
    from npujax.cli import main

    code = main(["fit", str(tmp_path / "absent.csv"), "--model", str(tmp_path / "absent.onnx"),
                 "--out", str(tmp_path / "out"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1

