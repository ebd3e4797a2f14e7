"""`npujax lower` with fusion, multi-core schedules and several models (in-process)."""

import json

import pytest

from npujax.cli import main


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
    s = json.loads((out / "schedule.json").read_text())
    assert s["fusion"] == "layer" and s["edges"] and s["memory"]["fits"]
    assert set(s["core_schedules"]) == {"layer_split", "pipeline"}
    assert s["dram_bytes"] < s["unfused_dram_bytes"]


def test_lower_two_models_sharing_the_npu(saved_models, tmp_path, capsys):
    out = tmp_path / "o"
    code = main(["lower", *saved_models, "--cores", "2", "--sharing", "core_partitioned",
                 "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "2 models on edge_16x16 (core_partitioned)" in text
    co = json.loads((out / "coresidency.json").read_text())
    assert [m["name"] for m in co["models"]] == ["digits.npz", "resnet.npz"]
    assert all(m["together_s"] >= m["alone_s"] for m in co["models"])


def test_lower_input_shape_for_a_missing_model(saved_models, capsys):
    code = main(["lower", *saved_models, "--input-shape", "3:x=1,3,8,8"])
    assert code == 2 and "for model 3" in capsys.readouterr().err
