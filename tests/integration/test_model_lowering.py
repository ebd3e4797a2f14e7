"""The real ONNX CNNs lowered on every shipped preset, through the API and the CLI."""

import json

import pytest

from npujax.frontends.onnx import from_onnx
from npujax.hw import list_presets, load_npu_spec
from npujax.ir.passes import optimize
from npujax.plan import lower
from tests.helpers import run_cli
from tests.onnx_models import zoo_path

pytestmark = pytest.mark.integration

SHAPES = {"ppocr_cls": (1, 3, 48, 192), "ppocr_det": (1, 3, 320, 320)}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def model(request):
    name = request.param
    path = zoo_path(name)
    graph, params = from_onnx(path, {"x": SHAPES[name]}, unsupported="fallback")
    return name, path, optimize(graph, params)[0]


def test_lowers_on_every_preset(model):
    name, _, graph = model
    for preset in list_presets():
        spec = load_npu_spec(preset)
        s = lower(graph, spec)
        assert s.latency_s > s.macs / spec.peak_macs_per_s
        assert sum(s.breakdown_s().values()) == pytest.approx(s.latency_s, rel=1e-5)
        conv = [r for r in s.layers if r.op == "Conv"]
        assert conv and all(r.device == "npu" for r in conv if r.reason == "")
        if preset == "gemmini_16x16":  # no average pooling / hard-sigmoid on Gemmini
            assert any(r.device == "cpu" for r in s.layers)
        assert s.peak_activation_bytes > 0


def test_cli_lower_onnx_with_sweep(model, tmp_path):
    name, path, _ = model
    if name != "ppocr_cls":
        pytest.skip("the resolution sweep is exercised on the small model")
    shape = ",".join(map(str, SHAPES[name]))
    r = run_cli("lower", str(path), "--input-shape",
                f"x={shape}", "--npu", "edge_16x16", "--sweep-resolution", "--out",
                str(tmp_path))
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "schedule.json").read_text())
    sweep = doc["resolution_sweep"]
    assert sweep["0.5"]["macs"] < sweep["1.0"]["macs"] < sweep["2.0"]["macs"]
    assert sweep["0.5"]["latency_s"] < sweep["1.0"]["latency_s"] < sweep["2.0"]["latency_s"]
    for f in ("layers.csv", "layer_latency.png", "breakdown.png", "roofline.png"):
        assert (tmp_path / f).stat().st_size > 0
    bad = run_cli("lower", str(path))
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
