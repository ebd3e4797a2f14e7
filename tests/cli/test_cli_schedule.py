"""`npujax lower` with fusion, multi-core schedules and several models (in-process)."""

import json

import pytest

from npujax.cli import main
from tests.helpers import run_cli


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory, small_resnet):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from npujax.frontends.flax import trace_flax
    from npujax.ir.passes import optimize
    from npujax.models.cnn import DigitsCNN
    from npujax.quantize.model_file import save_graph

    d = tmp_path_factory.mktemp("m")
    with jax.numpy_dtype_promotion("standard"):
        g, p = optimize(*trace_flax(DigitsCNN(rngs=nnx.Rngs(0)),
                                    jnp.zeros((1, 8, 8, 1), jnp.float32)))
    save_graph(d / "digits.npz", g, p)
    save_graph(d / "resnet.npz", *small_resnet)
    return [str(d / "digits.npz"), str(d / "resnet.npz")]


def test_lower_layer_fusion_and_core_schedules(saved_models, tmp_path, capsys):
    out = tmp_path / "o"
    code = main(["lower", saved_models[1], "--fusion", "layer", "--cores", "2", "--schedule",
                 "best", "--objective", "latency", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "activations between layers" in text and "multi-core schedules" in text
    assert "chosen:" in text and "memory" in text
    # the totals name their baseline: residual fusion, not the preset's elementwise default
    assert "(the residual fusion level, --fusion residual)" in " ".join(text.split())
    s = json.loads((out / "schedule.json").read_text())
    assert s["fusion"] == "layer" and s["edges"] and s["memory"]["fits"]
    assert set(s["core_schedules"]) == {"layer_split", "pipeline"}
    assert s["dram_bytes"] < s["unfused_dram_bytes"]


def test_lower_two_models_sharing_the_npu(saved_models, capsys):
    code = main(["lower", *saved_models, "--cores", "2", "--sharing", "core_partitioned"])
    text = capsys.readouterr().out
    assert code == 0 and "2 models on edge_16x16 (core_partitioned)" in text
    assert "fits" in text


def test_lower_input_shape_for_a_missing_model(saved_models, capsys):
    code = main(["lower", *saved_models, "--input-shape", "3:x=1,3,8,8"])
    assert code == 2 and "for model 3" in capsys.readouterr().err


# --- issue 14: flags that would do nothing, intermixed models, per-model outputs -------------


@pytest.fixture(scope="module")
def dynamic_onnx(tmp_path_factory):
    """A one-Relu ONNX model whose height and width are symbolic (needs --input-shape)."""
    from onnx import TensorProto, helper, save

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, "h", "w"])
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                            [x], [y]))
    path = tmp_path_factory.mktemp("onnx") / "dyn.onnx"
    save(m, str(path))
    return str(path)


@pytest.mark.parametrize("extra, flag", [
    (["--objective", "latency"], "--objective"),
    (["--schedule", "pipeline", "--objective", "latency"], "--objective"),
    (["--sharing", "core_partitioned"], "--sharing"),
    (["--sharing", "time_multiplexed"], "--sharing"),
])
def test_lower_refuses_flags_that_do_nothing(saved_models, extra, flag):
    r = run_cli("lower", saved_models[0], *extra)
    assert r.returncode == 2, r.stdout
    assert flag in r.stderr and ("--schedule best" in r.stderr or "two or more" in r.stderr)


def test_lower_models_may_follow_options(saved_models):
    r = run_cli("lower", "--npu", "edge_16x16", saved_models[0])
    assert r.returncode == 0, r.stderr
    r = run_cli("lower", saved_models[0], "--cores", "2", saved_models[1])
    assert r.returncode == 0, r.stderr
    assert "2 models on edge_16x16" in r.stdout


def test_lower_several_models_schedule_per_model_and_files(saved_models, tmp_path):
    out = tmp_path / "o"
    r = run_cli("lower", *saved_models, "--cores", "2", "--schedule", "best", "--objective",
                "latency", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "digits.npz: multi-core schedules" in r.stdout
    assert "resnet.npz: multi-core schedules" in r.stdout
    co = json.loads((out / "coresidency.json").read_text())
    assert [m["name"] for m in co["models"]] == ["digits.npz", "resnet.npz"]
    assert all(m["together_s"] >= m["alone_s"] for m in co["models"]) and co["fits"]
    for name in ("digits.npz", "resnet.npz"):
        s = json.loads((out / name / "schedule.json").read_text())
        assert s["chosen_core_schedule"] in ("layer_split", "pipeline") and "memory" in s
        assert (out / name / "layers.csv").is_file()
        assert (out / name / "roofline.png").is_file()


def test_lower_several_models_sweep_needs_onnx(saved_models):
    r = run_cli("lower", *saved_models, "--sweep-resolution")
    assert r.returncode == 2 and "--sweep-resolution" in r.stderr and "model 1" in r.stderr


def test_lower_missing_shape_names_the_model_and_prefix(saved_models, dynamic_onnx):
    r = run_cli("lower", saved_models[0], dynamic_onnx)
    assert r.returncode == 5, r.stdout  # GraphError
    assert "model 2 (dyn.onnx)" in r.stderr and "--input-shape 2:" in r.stderr


def test_lower_fusion_beyond_the_preset_is_noted(saved_models):
    # noted before anything is lowered (the run then stops at --weight-bits saved: cheap)
    r = run_cli("lower", saved_models[0], "--npu", "edge_16x16", "--fusion", "layer",
                "--weight-bits", "saved")
    assert "beyond what edge_16x16's compiler declares" in r.stderr
    r = run_cli("lower", saved_models[0], "--npu", "edge_16x16", "--fusion", "elementwise",
                "--weight-bits", "saved")
    assert "beyond" not in r.stderr and "no saved precision policy" in r.stderr


def test_lower_decoder_refuses_schedule():
    r = run_cli("lower", "decoder:tiny", "--schedule", "pipeline")
    assert r.returncode == 2 and "--schedule pipeline" in r.stderr


def test_lower_sustained_and_host_stages(saved_models, tmp_path, capsys):
    """--sustained on a preset that throttles, --host-stage around the NPU, both in
    schedule.json; the flags that would do nothing are refused."""
    from npujax.hw import load_npu_spec, spec_to_toml

    hot = tmp_path / "hot.toml"  # 3 W of static power at 30 K/W: it must throttle
    hot.write_text(spec_to_toml(load_npu_spec("edge_16x16").with_fields(
        {"thermal.static_power_w": 3.0, "thermal.junction_to_ambient_k_per_w": 30.0,
         "thermal.dvfs_thresholds_c": [85.0], "thermal.dvfs_clock_scales": [0.5]})))
    out = tmp_path / "o"
    code = main(["lower", saved_models[0], "--npu", str(hot), "--sustained", "300",
                 "--host-stage", "resize:from=64x48", "--host-stage", "topk:k=3",
                 "--out", str(out), "--no-progress"])
    text = " ".join(capsys.readouterr().out.split())
    assert code == 0
    assert "thermal throttling" in text and "first throttle after" in text
    assert "asynchronous, double-buffered" in text and "bounded by" in text
    s = json.loads((out / "schedule.json").read_text())
    sus, pipe = s["sustained"], s["host_pipeline"]
    assert sus["steps"][0]["latency_s"] == pytest.approx(s["latency_s"])
    assert sus["first_throttle_s"] > 0 and sus["steady_latency_s"] >= s["latency_s"]
    assert [x["name"] for x in pipe["stages"]] == ["resize", "copy_in", "npu", "copy_out",
                                                   "topk"]
    assert pipe["asynchronous"]["throughput_fps"] >= pipe["synchronous"]["throughput_fps"]
    assert run_cli("lower", saved_models[0], "--zero-copy").returncode != 0
