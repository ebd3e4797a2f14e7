"""Tracing transformers: NNX and Linen attention blocks, a ViT and an LLM decoder (prefill and
decode) become named graph ops that reproduce the model's output.

Cheap by construction: the NNX models are built by :func:`tests.helpers.numpy_init` (no XLA
program per initialiser) and compared jitted (one program per model, the same one that
``trace_flax``'s own check compiled, so the persistent compilation cache shares it)."""

from __future__ import annotations

import re
from collections import Counter

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from npujax.errors import ConfigError
from npujax.frontends.flax import trace_flax
from npujax.models.transformer import DECODER_CONFIGS, Decoder, ViT
from tests.helpers import jit_execute, jit_model, jit_once, numpy_fill, numpy_init

pytestmark = pytest.mark.flax_model

#: trace-vs-model tolerance (measured: <= 1.1e-6 on these models)
TOL = 1e-5


class NnxBlock(nnx.Module):
    def __init__(self, approximate: bool, rngs: nnx.Rngs) -> None:
        self.ln = nnx.LayerNorm(16, rngs=rngs)
        self.att = nnx.MultiHeadAttention(num_heads=2, in_features=16, decode=False, rngs=rngs)
        self.rms = nnx.RMSNorm(16, rngs=rngs)
        self.fc = nnx.Linear(16, 32, rngs=rngs)
        self.fc2 = nnx.Linear(32, 16, rngs=rngs)
        self.approximate = approximate

    def __call__(self, x):
        mask = nnx.make_causal_mask(jnp.ones(x.shape[:2]))
        x = x + self.att(self.ln(x), mask=mask)
        return x + self.fc2(nnx.gelu(self.fc(self.rms(x)), approximate=self.approximate))


class LinenBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.LayerNorm(name="ln")(x)
        h = nn.MultiHeadDotProductAttention(num_heads=2, name="att")(h, h)
        x = x + h
        return x + nn.Dense(16, name="fc")(nn.gelu(nn.RMSNorm(name="rms")(x)))


def _normal(seed, shape):
    """A float32 input drawn by numpy (``jax.random.normal`` compiles a program per shape)."""
    return jax.device_put(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _attention_in(graph, scope):
    """The attention nodes traced primitive by primitive (the two MatMuls, the Softmax) carry
    the path of the module they ran in, so a precision rule such as ``attn/.*`` reaches them."""
    for op in ("MatMul", "Softmax"):
        names = [n.name for n in graph.nodes if n.op == op and n.name.startswith(scope)]
        assert len(names) == (2 if op == "MatMul" else 1), (op, scope, [
            n.name for n in graph.nodes if n.op == op])
    rule = re.compile(re.escape(scope) + ".*")
    assert {n.op for n in graph.nodes if rule.fullmatch(n.name)} >= {"MatMul", "Softmax"}


def _error(graph, params, x, want):
    return float(np.max(np.abs(np.asarray(jit_execute(graph, params, x)) - np.asarray(want))))


@pytest.mark.parametrize("approximate", [True, False])
def test_nnx_attention_block(approximate):
    m = numpy_init(lambda: NnxBlock(approximate, nnx.Rngs(0)))
    x = _normal(1, (2, 5, 16))
    graph, params = trace_flax(m, x[:1])
    ops = Counter(n.op for n in graph.nodes)
    assert ops["LayerNormalization"] == 1 and ops["RMSNormalization"] == 1
    assert ops["Softmax"] == 1 and ops["Gelu"] == 1 and ops["MatMul"] == 2
    assert ops["Gemm"] == 6 and ops["Where"] == 1 and "JaxPrimitive" not in ops
    gelu = next(n for n in graph.nodes if n.op == "Gelu")
    assert gelu.attrs["approximate"] == ("tanh" if approximate else "none")
    names = {n.name for n in graph.nodes}
    assert {"ln", "rms", "att/query", "att/key", "att/value", "att/out", "fc", "fc2"} <= names
    assert set(params["ln"]) == {"scale", "bias"} and params["att/query"]["kernel"].shape == (
        16, 16)
    _attention_in(graph, "att/")
    assert _error(graph, params, x, jit_model(m)(x)) < TOL  # batch 2, graph traced at batch 1


def test_linen_attention_block():
    net = LinenBlock()
    x = _normal(0, (1, 6, 16))
    variables = numpy_fill(jax.eval_shape(net.init, jax.random.key(1), x))
    graph, params = trace_flax(net, x, variables=variables)
    ops = Counter(n.op for n in graph.nodes)
    assert ops["LayerNormalization"] == ops["RMSNormalization"] == ops["Softmax"] == 1
    assert ops["Gelu"] == 1 and ops["MatMul"] == 2 and "JaxPrimitive" not in ops
    _attention_in(graph, "att/")
    assert _error(graph, params, x, jit_once(lambda v, inp: net.apply(v, inp))(variables, x)) < TOL


@pytest.fixture(scope="module")
def decoders():
    cfg = DECODER_CONFIGS["tiny"]
    out = {}
    for phase in ("prefill", "decode"):
        m = numpy_init(lambda phase=phase: Decoder(cfg, phase=phase, seq_len=8,
                                                   kv_len=8, rngs=nnx.Rngs(0)))
        tokens = jnp.asarray(np.arange(8 if phase == "prefill" else 1)[None] * 7 % 64,
                             jnp.int32)
        out[phase] = (m, tokens, *trace_flax(m, tokens))
    return out


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_decoder_traces(decoders, phase):
    m, tokens, graph, params = decoders[phase]
    ops = Counter(n.op for n in graph.nodes)
    layers = DECODER_CONFIGS["tiny"].layers
    assert ops["Gather"] == 1 and ops["RMSNormalization"] == 2 * layers + 1
    assert ops["Softmax"] == layers and ops["MatMul"] == 2 * layers
    assert ops["Gemm"] == 7 * layers + 1 and "JaxPrimitive" not in ops
    assert ops["Where"] == (layers if phase == "prefill" else 0)  # the causal mask
    assert graph.tensors[graph.inputs[0]].dtype == "int32"
    assert set(params["embed"]) == {"table"}
    for i in range(layers):
        _attention_in(graph, f"blocks/{i}/attn/")
    assert {"add_0", "add_1"} & {n.name for n in graph.nodes} == set()  # (residuals: in blocks)
    assert "blocks/0/add_0" in {n.name for n in graph.nodes}
    assert _error(graph, params, tokens, jit_model(m)(tokens)) < TOL


def test_vit_traces():
    m = numpy_init(lambda: ViT(rngs=nnx.Rngs(0), layers=1, d_model=16, heads=2, d_ff=32))
    x = _normal(1, (1, 28, 28, 1))
    graph, params = trace_flax(m, x)
    ops = Counter(n.op for n in graph.nodes)
    assert ops["LayerNormalization"] == 3 and ops["Softmax"] == 1 and ops["Gelu"] == 1
    assert _error(graph, params, x, jit_model(m)(x)) < TOL


def test_vit_linear_patch_embedding_is_the_strided_conv():
    conv = numpy_init(lambda: ViT(rngs=nnx.Rngs(0), image=8, patch=4, channels=2, layers=1,
                                  d_model=8, heads=2, d_ff=16))
    lin = numpy_init(lambda: ViT(rngs=nnx.Rngs(0), image=8, patch=4, channels=2, layers=1,
                                 d_model=8, heads=2, d_ff=16, patch_embedding="linear"))
    state = nnx.state(conv, nnx.Param)
    state["patch"]["kernel"] = nnx.Param(jnp.reshape(conv.patch.kernel[...], (32, 8)))
    nnx.update(lin, state)  # the conv's weights, its (4, 4, 2, 8) kernel as (32, 8)
    x = _normal(2, (2, 8, 8, 2))
    graph, params = trace_flax(lin, x)
    assert Counter(n.op for n in graph.nodes)["Conv"] == 0 and "patch" in params
    assert _error(graph, params, x, jit_model(conv)(x)) < TOL
    with pytest.raises(ConfigError, match="patch_embedding must be 'conv' or 'linear'"):
        ViT(rngs=nnx.Rngs(0), patch_embedding="dense")
    with pytest.raises(ConfigError, match="multiple of patch"):
        ViT(rngs=nnx.Rngs(0), image=28, patch=5)


class HandWritten(nnx.Module):
    """LayerNorm and GELU written with jnp/lax: rsqrt, square, integer_pow and erfc become ONNX
    operators (never opaque JaxPrimitive nodes)."""

    def __init__(self, rngs):
        self.fc = nnx.Linear(8, 8, rngs=rngs)

    def __call__(self, x):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
        h = self.fc((x - mu) * jax.lax.rsqrt(var + 1e-5))
        h = h + 0.01 * h ** 3
        return 0.5 * h * jax.scipy.special.erfc(-h / np.sqrt(2.0))


def test_hand_written_primitives_become_onnx_ops():
    m = numpy_init(lambda: HandWritten(nnx.Rngs(0)))
    x = _normal(2, (1, 4, 8))
    graph, params = trace_flax(m, x)
    ops = Counter(n.op for n in graph.nodes)
    assert "JaxPrimitive" not in ops
    assert ops["Sqrt"] == 1 and ops["Reciprocal"] == 1 and ops["Erf"] == 1 and ops["Pow"] == 1
    assert _error(graph, params, x, jit_model(m)(x)) < TOL
