"""The Keras 3 frontend: a functional model of every intercepted layer and the common
functional ones traced with names from the Keras layers and the Keras output reproduced; a
``keras:`` application spec through the command line; and the errors a user can meet."""

import contextlib
import csv
import importlib.util
import sys

import jax
import numpy as np
import pytest

from npujax.errors import ConfigError, GraphError
from npujax.frontends import keras as npujax_keras
from npujax.frontends.keras import keras_application, trace_keras
from npujax.ir.execute import execute
from npujax.ir.passes import optimize
from tests.helpers import assert_close, run_cli

# keras is imported by the first test that needs it (seconds), not when the suite is collected
pytestmark = pytest.mark.skipif(importlib.util.find_spec("keras") is None,
                                reason="Keras is not installed (the keras extra)")


@pytest.fixture(scope="module")
def keras():
    """The keras module, on the JAX backend (npujax sets KERAS_BACKEND if keras is not yet
    imported)."""
    return npujax_keras._keras()


@contextlib.contextmanager
def _as_keras_runs():
    """JAX's default promotion, as a user's program runs Keras (the suite is strict for
    npujax's own numerics; Keras' Dense adds its bias by rank promotion)."""
    with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
        yield


def _tiny(keras):
    """Every intercepted layer (Conv2D with its activation inside, a DepthwiseConv2D with a
    multiplier, BatchNormalization without scale, a SeparableConv2D with a hard swish,
    LayerNormalization, Dense with softmax) and the common layers traced primitive by
    primitive; random BN statistics, so that folding is really tested."""
    L = keras.layers
    keras.utils.set_random_seed(1)
    inp = keras.Input((12, 12, 3))
    x = L.ZeroPadding2D(1, name="pad")(inp)
    x = L.Conv2D(8, 3, strides=2, activation="relu", name="stem")(x)
    x = L.BatchNormalization(scale=False, name="bn")(x)
    y = L.DepthwiseConv2D(3, padding="same", depth_multiplier=2, name="dw")(x)
    y = L.ReLU(6.0, name="dw_relu")(y)
    y = L.Conv2D(8, 1, use_bias=False, name="proj")(y)
    x = L.Add(name="add")([x, y]) * 0.5  # an operator of the model, in no layer's scope
    x = L.SeparableConv2D(8, 3, padding="same", activation="hard_silu", name="sep")(x)
    x = L.LayerNormalization(name="ln")(x)
    x = L.MaxPooling2D(2, name="pool")(x)
    x = L.AveragePooling2D(3, strides=1, padding="same", name="avg")(x)
    x = L.GlobalAveragePooling2D(name="gap")(x)
    out = L.Dense(5, activation="softmax", name="head")(x)
    model = keras.Model(inp, out, name="tiny")
    bn = model.get_layer("bn")
    rng = np.random.default_rng(0)
    bn.moving_mean.assign(rng.normal(size=8).astype(np.float32))
    bn.moving_variance.assign(rng.uniform(0.5, 2.0, size=8).astype(np.float32))
    return model


@pytest.fixture(scope="module")
def tiny(keras):
    """``(model, graph, params)``, traced once (the trace checks the output on its input)."""
    with _as_keras_runs():
        model = _tiny(keras)
        return model, *trace_keras(model)


def test_nodes_are_named_after_the_keras_layers(tiny):
    _, graph, params = tiny
    assert [(n.name, n.op) for n in graph.nodes] == [
        ("pad", "Pad"), ("stem", "Conv"), ("stem/relu", "Relu"), ("bn", "BatchNormalization"),
        ("dw", "Conv"), ("dw_relu", "Relu6"), ("proj", "Conv"), ("add", "Add"),
        ("tiny/mul", "Mul"), ("sep/depthwise", "Conv"), ("sep", "Conv"),
        ("sep/hardswish", "HardSwish"), ("ln", "LayerNormalization"), ("pool", "MaxPool"),
        ("avg", "AveragePool"), ("gap", "AveragePool"), ("gap/reshape", "Reshape"),
        ("head", "Gemm"), ("head/softmax", "Softmax")]
    assert graph.source == "keras" and graph.inputs == ("input",)
    assert graph.outputs == ("output",)
    assert graph.node("dw").attrs["groups"] == 8
    assert params["dw"]["kernel"].shape == (3, 3, 1, 16)  # HWIO, as the convolution uses it
    assert set(params["bn"]) == {"scale", "bias", "mean", "var"}
    assert np.all(np.asarray(params["bn"]["scale"]) == 1.0)  # scale=False
    assert set(params["proj"]) == {"kernel"}
    assert params["sep/depthwise"]["kernel"].shape == (3, 3, 1, 8)
    assert params["sep"]["kernel"].shape == (1, 1, 8, 8) and set(params["ln"]) == {"scale", "bias"}
    assert graph.node("avg").attrs["count_include_pad"] == 0  # Keras' "same" average pool


def test_graph_computes_the_keras_model_and_the_layers_are_restored(keras, tiny):
    model, graph, params = tiny
    x = np.random.default_rng(7).normal(size=(2, 12, 12, 3)).astype(np.float32)  # batch 2
    with _as_keras_runs():
        want = np.asarray(model(x, training=False))
    assert_close(execute(graph, params, x), want, rtol=1e-4, atol=1e-5)
    folded, folded_params = optimize(graph, params)  # the activations become epilogues
    assert folded.node("stem").attrs["epilogue"] == ("Relu",)
    assert folded.node("dw").attrs["epilogue"] == ("Relu6",)
    assert_close(execute(folded, folded_params, x), want, rtol=1e-4, atol=1e-5)
    # the patched calls are gone, also where the class only inherited its call
    assert "call" not in keras.layers.Conv2D.__dict__
    assert keras.layers.Dense.__dict__["call"].__module__.startswith("keras.")
    assert model.get_layer("stem").activation is keras.activations.relu


@pytest.mark.integration  # a real application (MobileNet) through the command line
def test_an_application_spec_on_the_command_line(keras, tmp_path):
    spec = "keras:MobileNet:alpha=0.25:input_shape=32x32x3"  # the smallest MobileNet
    r = run_cli("topology", spec, "--out", tmp_path / "t.csv")
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "t.csv") as f:
        rows = list(csv.reader(f))
    names = [row[0].strip() for row in rows[1:]]
    assert names[0] == "conv1" and names[-1] == "conv_preds"
    assert "conv_pw_13" in names and "DP_conv_dw_13" in names
    # the same seeded weights and layer names on every build
    with _as_keras_runs():
        a, b = keras_application(spec), keras_application(spec)
    assert [la.name for la in a.layers] == [lb.name for lb in b.layers]
    assert np.array_equal(a.get_layer("conv1").kernel, b.get_layer("conv1").kernel)


@pytest.mark.parametrize("spec,message", [
    ("keras:MobileNetv2", "did you mean MobileNetV2"),
    ("keras:MobileNet:alpah=0.25", "did you mean alpha"),
    ("keras:MobileNet:alpha", "is not key=value"),
    ("keras:MobileNet:weights=imagenet", "random weights"),
    ("keras:MobileNet:input_shape=32x32", "is not HxWxC"),
    ("keras:MobileNet:input_shape=16x16x3", "Keras refuses"),
    ("keras:MobileNet:input_shape=-3x32x3", "is not HxWxC"),
])
def test_spec_errors_name_the_fix(keras, spec, message):
    with pytest.raises(ConfigError, match=message):
        keras_application(spec)


def test_other_objects_are_refused(keras):
    with pytest.raises(GraphError, match="needs a Keras 3 model"):
        trace_keras(object())
    with pytest.raises(ConfigError, match="write keras:NAME"):
        trace_keras("MobileNet")


def test_missing_keras_or_another_backend_says_what_to_do(keras, monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "torch")
    with pytest.raises(ConfigError, match="KERAS_BACKEND=jax"):
        npujax_keras._keras()
    monkeypatch.setitem(sys.modules, "keras", None)  # what `import keras` meets when absent
    with pytest.raises(ConfigError, match=r'pip install "npujax\[keras\]"'):
        npujax_keras._keras()
