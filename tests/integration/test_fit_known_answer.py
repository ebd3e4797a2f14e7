"""``npujax fit`` against a known answer, end to end through the command line: a profile that
``npujax lower`` writes for a preset with hidden values is fitted from another preset; the fit
must recover the hidden values it can identify within 5 %, write a preset every command reads,
and predict a second model within 5 % MAPE. And a real onnxruntime profile of the PP-OCR
classifier matches every one of its node names to a layer."""

import json

import numpy as np
import pytest

from npujax.cli import main
from npujax.hw import load_npu_spec
from npujax.ir.passes import optimize
from npujax.plan import lower
from npujax.plan.fit import fit_metrics
from npujax.report import write_layers_csv

pytestmark = pytest.mark.integration

HIDDEN = {"array.clock_hz": 0.7e9, "memory.dram_bytes_per_s": 9.6e9, "vector.lanes": 32,
          "host.cpu_ops_per_s": 3e10}
#: the classifier's only CPU-fallback layer (Softmax) is dominated by the host link's latency,
#: so its profile cannot pin down the host's speed: the fit must say so
NOT_IDENTIFIABLE = {"host.cpu_ops_per_s"}


def test_fit_recovers_hidden_preset_and_predicts_another_model(tmp_path, ppocr_cls,
                                                               small_resnet):
    path, graph_raw, params = ppocr_cls
    hidden = load_npu_spec("edge_16x16").with_fields(HIDDEN, name="hidden")
    shape = ["--input-shape", "x=1,3,48,192"]
    # the profile: the layers.csv `npujax lower --out` writes, of the hidden preset
    graph_cls = optimize(graph_raw, params)[0]
    write_layers_csv(tmp_path / "layers.csv", lower(graph_cls, hidden))
    out = tmp_path / "fit"
    assert main(["-q", "fit", str(tmp_path / "layers.csv"), "--model", str(path),
                 *shape, "--npu", "edge_16x16", "--params",
                 "clock_hz,dram_bytes_per_s,lanes,cpu_ops_per_s",
                 "--steps", "300", "--no-progress", "--out", str(out)]) == 0
    report = json.loads((out / "fit.json").read_text())
    fitted = load_npu_spec(out / "fitted.toml")
    checked = 0
    for field, value in HIDDEN.items():
        assert report["identifiable"][field] == (field not in NOT_IDENTIFIABLE), field
        if field in NOT_IDENTIFIABLE:  # said so, and left as the preset had it
            assert fitted.host.cpu_ops_per_s == load_npu_spec("edge_16x16").host.cpu_ops_per_s
            continue
        section, key = field.split(".")
        assert getattr(getattr(fitted, section), key) == pytest.approx(value, rel=0.05), field
        checked += 1
    assert checked == 3
    assert report["after"]["mape"] < 2.0 and report["before"]["mape"] > 20.0
    assert {"fitted.toml", "fit.json", "fit_layers.csv", "fit.png"} <= {
        p.name for p in out.iterdir()}
    # the fitted preset is a normal preset: every command takes it
    assert main(["-q", "lower", str(path), *shape, "--npu", str(out / "fitted.toml")]) == 0
    # and it predicts a model it never saw
    graph, _ = small_resnet
    truth = np.array([r.latency_s for r in lower(graph, hidden).layers])
    pred = np.array([r.latency_s for r in lower(graph, fitted).layers])
    assert fit_metrics(truth, pred)["mape"] < 5.0


def test_onnxruntime_profile_of_a_real_model_matches_every_node(tmp_path, ppocr_cls):
    ort = pytest.importorskip("onnxruntime")
    from npujax.plan import workloads
    from npujax.plan.profile import match_profile, read_profile
    from npujax.workflows.fit import load_model_graphs

    path, _, _ = ppocr_cls
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "cls")
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 48, 192)).astype(np.float32)
    for _ in range(3):
        sess.run(None, {"x": x})
    prof = read_profile(sess.end_profiling())
    assert prof.format == "onnxruntime" and set(prof.runs) == {3}
    raw, graph = load_model_graphs(path, {"x": (1, 3, 48, 192)})
    layers = workloads(graph, load_npu_spec("edge_16x16"))
    m = match_profile(prof, layers, raw)  # raises on any unmatched name
    assert m.skipped == () and sum(len(n) for n in m.names) == len(prof.names)
    assert np.isclose(m.measured_s.sum(), prof.latency_s.sum())
