"""QAT in the user's own Flax loop: ``quantize_model`` gives an nnx.Module whose params are the
model's own, runs the same graph as the existing QAT path (same numbers), trains with any optax
transform under nnx.jit, checkpoints with orbax, and leaves the trained weights in the original
module; the Linen equivalent; Qwix-vocabulary rules."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import npujax
from npujax.errors import ConfigError
from npujax.frontends.flax import trace_flax
from npujax.ir.passes import fold_batchnorm
from npujax.numerics import FP8_E4M3FN, IntFormat
from npujax.quantize.rules import QuantRule, parse_qtype, quant_spec_from_rules
from npujax.quantize.train import TrainConfig, train_graph
from tests.helpers import assert_close, jit_execute, numpy_init

pytestmark = pytest.mark.flax_model

W8A8 = [QuantRule(module_path=".*", weight_qtype="int8", act_qtype="int8")]


_MODELS = {}


def _model(seed=0):
    """A tiny DigitsCNN with non-trivial BN statistics; built once per seed, cloned per use
    (initialising an NNX model costs seconds on a loaded CPU, cloning it nothing)."""
    from npujax.models.cnn import DigitsCNN

    if seed not in _MODELS:  # numpy weights: Flax's initialisers compile ~20 programs
        m = numpy_init(lambda: DigitsCNN(rngs=nnx.Rngs(seed), width=4, hidden=16), seed)
        rng = np.random.default_rng(seed)
        for bn in (m.bn1, m.bn2):
            n = bn.mean[...].shape[0]
            bn.mean[...] = jnp.asarray(rng.normal(size=n), jnp.float32)
            bn.var[...] = jnp.asarray(rng.uniform(0.5, 2.0, n), jnp.float32)
        _MODELS[seed] = m
    return nnx.clone(_MODELS[seed])


@nnx.jit
def _call(model, x):
    """``model(x)`` as one compiled program (eagerly every op of a transformer compiles its own:
    ~50 programs), its variables read at each call."""
    return model(x)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(48, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, 48).astype(np.int32)
    return x, y


def _batches(x, y, n=3, bs=16):
    return [(x[i * bs:(i + 1) * bs], y[i * bs:(i + 1) * bs]) for i in range(n)]


# -- rules in Qwix's vocabulary


def test_qwix_rules_full_match_qtypes_and_unmatched_rule(data):
    graph, params = fold_batchnorm(*trace_flax(_model(), data[0][:1]))
    # module_path must match the whole name: "conv" matches neither conv1 nor conv2
    with pytest.raises(ConfigError, match="match no layer"):
        quant_spec_from_rules(graph, [QuantRule(module_path="conv", weight_qtype="int8")])
    spec = quant_spec_from_rules(graph, [
        QuantRule(module_path="conv1", weight_qtype="int4", act_qtype="int8"),
        QuantRule(module_path="fc.", weight_qtype="float8_e4m3fn"),  # no act_qtype: float input
    ])
    assert spec["conv1"].weight == IntFormat(4, narrow_range=True)
    assert spec["conv1"].act == IntFormat(8, signed=False)
    assert spec["fc1"].weight == FP8_E4M3FN and spec["fc1"].act is None
    assert "conv2" not in spec
    # npujax's pattern keeps re.search semantics: "conv" matches both convs
    assert set(quant_spec_from_rules(graph, [QuantRule(pattern="conv")])) == {"conv1", "conv2"}
    # a Qwix QtRule (duck-typed) works as is
    qt = types.SimpleNamespace(module_path="fc2", weight_qtype=jnp.int8, act_qtype=None)
    assert quant_spec_from_rules(graph, [qt])["fc2"].weight == IntFormat(8, narrow_range=True)


def test_qtype_errors_name_the_field():
    assert parse_qtype("uint4") == ("int", 4, False)
    with pytest.raises(ConfigError, match="weight_qtype.*int7x"):
        QuantRule(module_path=".*", weight_qtype="int7x")
    with pytest.raises(ConfigError, match="exactly one of pattern"):
        QuantRule(pattern="a", module_path="a")
    with pytest.raises(npujax.NpujaxError, match="bits"):
        QuantRule(module_path=".*", weight_qtype="int1")


# -- NNX


def test_forward_equals_the_traced_graph_and_any_batch(data):
    x, _ = data
    m = _model()
    q = npujax.quantize_model(m, W8A8, x[:16])
    assert isinstance(q, nnx.Module) and q.model is m
    graph, params = trace_flax(m, x[:1])
    fgraph, fparams = fold_batchnorm(graph, params)
    qstate = npujax.calibrate(fgraph, fparams, [x[:16]], q.plan.quant)
    quant = q.plan.quant  # compiled, as a user runs it (op by op: a program per op and shape)
    run = jax.jit(lambda g, p, s, x: npujax.execute(g, p, x, quant=quant, qstate=s),
                  static_argnums=0)
    want = run(fgraph, fparams, qstate, x)
    forward = nnx.jit(lambda q, x: q(x))
    assert_close(forward(q, x), want)
    assert forward(q, x[:7]).shape == (7, 10)
    g, p, s = npujax.quantize.graph_of(q)
    assert_close(run(g, p, s, x), want)


def test_user_loop_equals_train_graph_and_writes_into_the_model(data):
    x, y = data
    m = _model()
    q = npujax.quantize_model(m, W8A8, x)
    graph, params = trace_flax(_model(), x[:1])  # the existing QAT path, same start
    qstate = npujax.quantize.graph_of(q)[2]
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(3e-3))
    want = train_graph(graph, params, _batches(x, y), quant=q.plan.quant, qstate=qstate,
                       config=TrainConfig(fold_bn=True, optimizer=tx)).params

    opt = nnx.Optimizer(q, tx, wrt=nnx.Param)

    @nnx.jit
    def step(q, opt, xb, yb):
        def loss_fn(q):
            return optax.softmax_cross_entropy_with_integer_labels(q(xb), yb).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(q)
        opt.update(q, grads)
        return loss

    losses = [float(step(q, opt, xb, yb)) for xb, yb in _batches(x, y)]
    assert all(np.isfinite(losses))
    for name in ("conv1", "conv2", "fc1", "fc2"):
        assert_close(getattr(m, name).kernel[...], want[name]["kernel"], atol=1e-5)
    assert_close(m.bn1.scale[...], want["bn1"]["scale"], atol=1e-5)
    assert_close(m.bn1.mean[...], params["bn1"]["mean"])  # running statistics frozen
    # the original module holds the trained weights; write_back copies into another instance
    other = _model(seed=5)
    assert npujax.quantize.write_back(q) is m
    npujax.quantize.write_back(q, other)
    np.testing.assert_array_equal(np.asarray(other.fc1.kernel[...]), np.asarray(m.fc1.kernel[...]))


def test_calibrate_model_from_an_iterator_and_lsq_steps_train(data):
    x, y = data
    q = npujax.quantize_model(_model(), [QuantRule(pattern=".*", weight_bits=4, act_bits=4,
                                                   quantizer="lsq")], x[:4])
    before = q.current_qstate()["fc1"].act_scale
    npujax.quantize.calibrate_model(q, (x[i:i + 16] for i in range(0, 48, 16)), observer="minmax")
    assert float(q.current_qstate()["fc1"].act_scale) != float(before)
    step0 = np.asarray(q.learned.get_value()["fc1"]["weight_step"])
    opt = nnx.Optimizer(q, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit  # as a user's training step (eagerly every op compiled on its own: ~100 programs)
    def step(q, opt):
        grads = nnx.grad(lambda q: optax.softmax_cross_entropy_with_integer_labels(
            q(x), y).mean())(q)
        opt.update(q, grads)

    step(q, opt)
    assert not np.allclose(np.asarray(q.learned.get_value()["fc1"]["weight_step"]), step0)


def test_orbax_checkpoint_round_trip(data, tmp_path):
    import orbax.checkpoint as ocp

    x, _ = data
    q = npujax.quantize_model(_model(), W8A8, x[:8])
    want = q(x[:8])
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(tmp_path / "ckpt", nnx.state(q))
        fresh = npujax.quantize_model(_model(seed=3), W8A8, x[8:16])
        restored = ckpt.restore(tmp_path / "ckpt", nnx.state(fresh))
    nnx.update(fresh, restored)
    assert_close(fresh(x[:8]), want)


def test_bad_calls_raise_helpful_errors(data):
    x, _ = data
    with pytest.raises(ConfigError, match="match no layer"):
        npujax.quantize_model(_model(), [QuantRule(module_path="typo", weight_qtype="int8")],
                              x[:2])
    with pytest.raises(ConfigError, match="Linen"):
        npujax.quantize_model(_model(), W8A8, x[:2], variables={})
    with pytest.raises(ConfigError, match="quantize_model"):
        npujax.quantize.graph_of(object(), {})


# -- Linen


def test_linen_equivalent(data):
    import flax.linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = x.reshape(x.shape[0], -1)
            return nn.Dense(10, name="head")(nn.relu(nn.Dense(16, name="fc")(x)))

    x, y = data
    model = MLP()
    variables = jax.jit(model.init)(jax.random.key(0), x[:1])  # (eagerly: ~13 programs)
    qm, qv = npujax.quantize_model(model, W8A8, x[:16], variables=variables)
    g, p, s = npujax.quantize.graph_of(qm, qv)
    assert_close(qm.apply(qv, x), jit_execute(g, p, x, quant=qm.plan.quant, qstate=s))

    def loss(params):
        out = qm.apply({**qv, "params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(out, y).mean()

    tx = optax.sgd(0.1)

    @jax.jit  # a user's training step (eagerly every op compiles its own program: ~60)
    def step(params):
        updates, _ = tx.update(jax.grad(loss)(params), tx.init(params), params)
        return optax.apply_updates(params, updates)

    qv = {**qv, "params": step(qv["params"])}
    qv = npujax.quantize.calibrate_model(qm, [x], variables=qv)
    plain = npujax.quantize.write_back(qm, qv)
    assert set(plain) == set(variables)
    assert not np.allclose(np.asarray(plain["params"]["fc"]["kernel"]),
                           np.asarray(variables["params"]["fc"]["kernel"]))
    model.apply(plain, x)  # the user's own module runs the trained variables


@pytest.mark.integration  # ~10 s on a loaded 2-core machine: two transformers traced
def test_transformers_share_reshaped_attention_kernels_and_keep_int_tokens():
    """A ViT's ``nnx.MultiHeadAttention`` kernels are ``(in, heads, head_dim)`` variables that the
    graph runs as ``(in, heads * head_dim)``: shared, reshaped, read live (a new value in the
    module is what the quantized model runs). A decoder's int32 token ids stay integers (an
    ``nnx.Embed`` lookup), its single input any batch."""
    from npujax.models.transformer import DECODER_CONFIGS, Decoder, ViT

    vit = ViT(image=4, patch=2, channels=1, d_model=8, heads=2, d_ff=8, layers=1,
              classes=3, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (4, 4, 4, 1))
    q = npujax.quantize_model(vit, W8A8, x)
    assert_close(q(x), _call(vit, x), atol=0.05)
    before = q(x)
    kernel = vit.attns[0].value.kernel
    kernel.set_value(-2 * kernel[...])  # (8, 2, 4), run as (8, 8)
    assert not np.allclose(q(x), before, atol=0.05)
    npujax.quantize.calibrate_model(q, [x])  # the static activation ranges, for the new weights
    assert_close(q(x), _call(vit, x), atol=0.05)
    cfg = dataclasses.replace(DECODER_CONFIGS["tiny"], d_model=16, d_ff=16, layers=1)
    dec = Decoder(cfg, seq_len=4, rngs=nnx.Rngs(0))
    tokens = jnp.arange(12, dtype=jnp.int32).reshape(3, 4)
    q = npujax.quantize_model(dec, W8A8, tokens)
    assert q(tokens[:2]).shape == (2, 4, cfg.vocab)
    assert_close(q(tokens), _call(dec, tokens), atol=0.1)
