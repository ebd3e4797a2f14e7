"""A parameter that the traced graph folds into a constant (used in plain arithmetic, not
through a layer: a ViT's position embedding or class token, a learned scale) is not trained by
QAT through ``quantize_model``; the user is told which, instead of finding zero gradients."""

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import npujax

W8A8 = [npujax.QuantRule(module_path=".*", weight_qtype="int8", act_qtype="int8")]


class _WithPos(nnx.Module):
    def __init__(self, rngs):
        self.pos = nnx.Param(jnp.zeros((1, 4)))
        self.fc = nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, x):
        return self.fc(x + self.pos)


class _Plain(nnx.Module):
    def __init__(self, rngs):
        self.fc = nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, x):
        return self.fc(x)


def _x():
    return np.random.default_rng(0).uniform(size=(8, 4)).astype(np.float32)


def test_nnx_param_outside_a_layer_is_named(caplog):
    x = _x()
    with caplog.at_level(logging.WARNING, logger="npujax"):
        q = npujax.quantize_model(_WithPos(nnx.Rngs(0)), W8A8, x)
    assert "1 parameter(s) of the model (pos)" in caplog.text  # pos only: fc is shared
    assert "does not train" in caplog.text
    # and it is indeed constant for QAT: the user's optimizer gets a zero gradient for it
    grads = nnx.grad(lambda m: optax.softmax_cross_entropy_with_integer_labels(
        m(x), jnp.zeros(8, jnp.int32)).mean())(q)
    assert float(jnp.abs(grads.model.pos[...]).max()) == 0.0


def test_no_warning_when_every_param_is_shared(caplog):
    with caplog.at_level(logging.WARNING, logger="npujax"):
        npujax.quantize_model(_Plain(nnx.Rngs(0)), W8A8, _x())
    assert "does not train" not in caplog.text


def test_linen_param_outside_a_layer_is_named(caplog):
    class M(nn.Module):
        @nn.compact
        def __call__(self, x):
            pos = self.param("pos", nn.initializers.zeros, (1, 4))
            return nn.Dense(3, name="fc")(x + pos)

    x = _x()
    v = M().init(jax.random.key(0), x[:1])
    with caplog.at_level(logging.WARNING, logger="npujax"):
        npujax.quantize_model(M(), W8A8, x, variables=v)
    assert "1 parameter(s) of the model (pos)" in caplog.text and "does not train" in caplog.text
