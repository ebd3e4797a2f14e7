"""Data-loader mistakes a user makes with the iterator APIs (``calibrate``,
``calibrate_model``, ``train_graph``) raise an NpujaxError that says what was passed and how
to fix it, not a numpy/optax traceback."""

import numpy as np
import optax
import pytest
from flax import nnx

import npujax
from npujax.errors import CalibrationError, ConfigError
from npujax.quantize import TrainConfig


class _Tiny(nnx.Module):
    def __init__(self, rngs):
        self.fc = nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, x):
        return self.fc(x)


@pytest.fixture(scope="module")
def tiny():
    x = np.random.default_rng(0).uniform(size=(8, 4)).astype(np.float32)
    y = np.arange(8, dtype=np.int32) % 3
    graph, params = npujax.trace_flax(_Tiny(nnx.Rngs(0)), x[:1])
    return graph, params, x, y


def test_calibrate_given_input_target_pairs(tiny):
    graph, params, x, y = tiny
    q = npujax.quant_spec(graph)
    with pytest.raises(CalibrationError, match=r"\(inputs, targets\).*x for x, _ in"):
        npujax.calibrate(graph, params, [(x, y)], q)


def test_train_graph_iterable_with_y(tiny):
    graph, params, x, y = tiny
    batches = [(x, y)]
    for steps in (None, 2):
        with pytest.raises(ConfigError, match="y is given with an iterable"):
            npujax.train_graph(graph, params, iter(batches), y, config=TrainConfig(
                steps=steps, optimizer=optax.sgd(0.1)))


def test_train_graph_batches_without_targets(tiny):
    graph, params, x, _ = tiny
    with pytest.raises(ConfigError, match=r"batch 0 .*\(inputs, targets\)"):
        npujax.train_graph(graph, params, (x[i:i + 4] for i in (0, 4)),
                           config=TrainConfig(optimizer=optax.sgd(0.1)))


def test_train_graph_optimizer_not_a_transform():
    with pytest.raises(ConfigError, match="optimizer must be .*GradientTransformation.*optax.adam"):
        TrainConfig(steps=1, optimizer="adam")


@pytest.mark.parametrize("fields, message", [
    (dict(steps=0), r"TrainConfig.steps must be an int >= 1, got 0; pass"),
    (dict(steps=2.5), r"TrainConfig.steps .* got 2.5"),
    (dict(steps=True), r"TrainConfig.steps .* got True"),
    (dict(), r"TrainConfig.steps is None.*optimizer"),
    (dict(steps=1, learning_rate=0.0), r"TrainConfig.learning_rate .* > 0, got 0.0; pass"),
    (dict(steps=1, learning_rate=float("nan")), r"TrainConfig.learning_rate .* got nan"),
    (dict(steps=1, batch_size=0), r"TrainConfig.batch_size must be an int >= 1, got 0"),
    (dict(steps=1, seed=-1), r"TrainConfig.seed must be an int >= 0, got -1"),
    (dict(steps=1, seed=2**32), r"TrainConfig.seed must be in \[0, 2\*\*32\)"),
    (dict(steps=1, loss_fn="mse"), r"TrainConfig.loss_fn must be a function.*'mse'"),
    (dict(steps=1, fold_bn="yes"), r"TrainConfig.fold_bn must be True or False, got 'yes'"),
    (dict(steps=1, devices=0), r"TrainConfig.devices must be .* got 0"),
    (dict(steps=1, devices="gpu"), r"TrainConfig.devices must be .* got 'gpu'"),
    (dict(steps=1, devices=[]), r"TrainConfig.devices is an empty sequence"),
])
def test_train_config_names_the_field_the_value_and_the_fix(fields, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**fields)


def test_train_config_is_frozen_keyword_only_and_hashable():
    import dataclasses

    c = TrainConfig(steps=3, devices=["d0", "d1"])
    assert c.devices == ("d0", "d1") and hash(c) == hash(TrainConfig(steps=3,
                                                                     devices=("d0", "d1")))
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.steps = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        TrainConfig(3)  # type: ignore[misc]
    assert dataclasses.replace(c, steps=5).steps == 5


def test_train_graph_needs_steps_with_arrays_and_a_train_config(tiny):
    graph, params, x, y = tiny
    with pytest.raises(ConfigError, match="arrays .* TrainConfig.steps=None"):
        npujax.train_graph(graph, params, x, y, config=TrainConfig(optimizer=optax.sgd(0.1)))
    with pytest.raises(ConfigError, match="config must be a TrainConfig"):
        npujax.train_graph(graph, params, x, y, config={"steps": 1})  # type: ignore[arg-type]


@pytest.mark.flax_model  # optax's Adam mixes int and float: standard promotion
def test_train_graph_returns_params_and_the_learned_qstate(tiny):
    graph, params, x, y = tiny
    q = npujax.quant_spec(graph, 4, 4, quantizer="lsq")
    qstate = npujax.calibrate(graph, params, [x], q)
    r = npujax.train_graph(graph, params, x, y, quant=q, qstate=qstate,
                           config=TrainConfig(steps=2, learning_rate=1e-2, batch_size=4))
    assert r.steps == 2 and set(r.params) == set(params) and set(r.qstate) == set(qstate)
    (name,) = qstate
    assert not np.array_equal(np.asarray(r.qstate[name].weight_step),
                              np.asarray(qstate[name].weight_step))  # learned, not dropped
    r = npujax.train_graph(graph, params, x, y, config=TrainConfig(steps=1))
    assert r.qstate == {} and r.steps == 1


def test_train_graph_says_when_the_iterable_ends_before_steps(tiny, caplog):
    import logging

    graph, params, x, y = tiny
    with caplog.at_level(logging.WARNING, logger="npujax"):
        npujax.train_graph(graph, params, [(x, y)] * 2,
                           config=TrainConfig(steps=5, optimizer=optax.sgd(0.1)))
    assert "ended after 2 of the 5 steps" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="npujax"):
        r = npujax.train_graph(graph, params, [(x, y)] * 2,
                               config=TrainConfig(optimizer=optax.sgd(0.1)))
    assert "ended after" not in caplog.text  # steps=None: until the iterable ends, as asked
    assert r.steps == 2


def test_graph_of_given_the_linen_pair_says_how_to_call_it():
    import flax.linen as nn
    import jax

    m = nn.Dense(3)
    x = np.ones((2, 4), np.float32)
    pair = npujax.quantize_model(m, [npujax.QuantRule(pattern=".*")], x,
                                 variables=m.init(jax.random.key(0), x))
    with pytest.raises(ConfigError, match=r"graph_of\(qmodule, qvariables\)"):
        npujax.quantize.graph_of(pair)
    graph, _, _ = npujax.quantize.graph_of(*pair)
    assert graph.nodes


def test_a_model_that_is_one_layer_quantizes():
    """``quantize_model(nnx.Linear(...))``: the layer is the model itself (before: 'matches no
    module of the model; please report'; Linen ``nn.Dense``: a KeyError)."""
    x = np.random.default_rng(0).uniform(size=(2, 4)).astype(np.float32)
    lin = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    q = npujax.quantize_model(lin, [npujax.QuantRule(pattern=".*")], x)
    np.testing.assert_allclose(q(x), lin(x), atol=0.05)


def test_unsigned_weight_qtype_is_refused():
    """npujax's weights are signed symmetric: ``weight_qtype="uint4"`` was silently read as a
    signed int4 grid; it now says so (activations: ``uint8`` = ``int8``, unsigned by default)."""
    with pytest.raises(ConfigError, match=r"weight_qtype 'uint4'.*signed.*'int4'"):
        npujax.QuantRule(module_path=".*", weight_qtype="uint4")
    rule = npujax.QuantRule(module_path=".*", weight_qtype="int4", act_qtype="uint8")
    assert rule.layer_quant().act.signed is False
