"""Per-layer sensitivity to quantization: Hessian trace (Hutchinson) and weight perturbation.

* **Hessian trace** (HAWQ-V2: Dong et al., NeurIPS 2020, arXiv:1911.03852). For the loss ``L`` and
  the kernel ``W_l`` of layer ``l``, ``Tr(H_ll) = E_v[v_l^T (H v)_l]`` for Rademacher ``v``
  (Hutchinson 1990). ``H v`` is a Hessian-vector product computed forward-over-reverse
  (``jax.jvp`` of ``jax.grad``), so one product per sample gives every layer's trace at once
  (cross terms vanish in expectation). Reported as the mean per weight, ``Tr(H_ll) / n_l``.
* **Activations**: the empirical-Fisher analogue for each layer's input activation,
  :func:`activation_sensitivity`.
* **Weights vs activations, measured**: :func:`most_sensitive_layers` ranks layers by
  :func:`npujax.quantize.sensitivity.sensitivity_split` (model-output SQNR with one layer's
  weights, or its inputs, quantized alone), the layers ``npujax search --pin sensitive`` keeps
  wide.
* **Perturbation** ``||Q_b(W_l) - W_l||_2^2`` of the symmetric per-channel quantizer at ``b``
  bits, and the HAWQ-V3 sensitivity ``Omega_l(b) = Tr(H_ll)/n_l * ||Q_b(W_l) - W_l||^2`` that the
  integer program minimises (Yao et al., ICML 2021, arXiv:2011.10680).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import Partial

from npujax._progress import track
from npujax.errors import ConfigError
from npujax.ir.execute import execute
from npujax.ir.graph import Graph, Node, Params
from npujax.numerics import IntFormat, fake_quant, qparams_from_range
from npujax.ops import kernel_out_axis, quantizable_nodes
from npujax.quantize.calibrate import calibrate
from npujax.quantize.parallel import data_parallel
from npujax.quantize.quantizers import quantize_weight
from npujax.quantize.quantizers.mixture import set_probabilities
from npujax.quantize.sensitivity import LayerSensitivity, sensitivity_split
from npujax.quantize.spec import quant_spec
from npujax.quantize.train import cross_entropy
from npujax.search.objective import fisher_targets

if TYPE_CHECKING:
    from npujax.search.base import SearchProblem
    from npujax.search.config import SearchConfig

__all__ = ["hessian_traces", "activation_sensitivity", "weight_perturbation", "hawq_sensitivity",
           "loss_sensitivity", "layer_sensitivity", "most_sensitive_layers"]


def hessian_traces(
    loss_fn: Callable[[Params, Any], jax.Array],
    params: Params,
    batch: Any,
    layers: Sequence[str],
    *,
    samples: int = 16,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, float]:
    """Hutchinson estimate of the per-weight Hessian trace of each layer's kernel.

    Args:
      loss_fn: ``loss_fn(params, batch)`` -> scalar loss (e.g. cross-entropy of the graph).
      params: ``{layer: {"kernel": ..., ...}}``.
      batch: the data the loss is evaluated on (any pytree of arrays; passed as an argument so
        that it is not baked into the compiled program).
      layers: layer names whose ``kernel`` traces are wanted.
      samples: Rademacher probes (the estimate's standard error falls as 1/sqrt(samples)).
      seed: PRNG seed of the probes.
      progress: show a progress bar.

    Returns:
      ``{layer: Tr(H_ll) / n_l}`` (float; may be negative away from a minimum).

    Raises:
      ConfigError: ``samples`` < 1 or a layer without a kernel.
    """
    if samples < 1:
        raise ConfigError(f"samples must be >= 1, got {samples}.")
    missing = [n for n in layers if "kernel" not in params.get(n, {})]
    if missing:
        raise ConfigError(f"layers {missing} have no 'kernel' parameter.")
    grad = jax.grad(loss_fn)

    @jax.jit
    def probe(key, params, batch):
        keys = jax.random.split(key, len(layers))
        v = jax.tree.map(jnp.zeros_like, params)
        for k, n in zip(keys, layers):
            w = params[n]["kernel"]
            v[n]["kernel"] = jax.random.rademacher(k, w.shape, w.dtype)
        hv = jax.jvp(lambda p: grad(p, batch), (params,), (v,))[1]
        return jnp.stack([jnp.vdot(v[n]["kernel"], hv[n]["kernel"]) for n in layers])

    keys = jax.random.split(jax.random.key(seed), samples)
    total = np.zeros(len(layers))
    for i in track(range(samples), "Hessian trace", progress):
        total += np.asarray(probe(keys[i], params, batch), np.float64)
    sizes = np.asarray([params[n]["kernel"].size for n in layers], np.float64)
    return {n: float(t) for n, t in zip(layers, total / samples / sizes)}


def _offset_and_tap(offsets: dict[str, jax.Array], node: Node, inputs: list[jax.Array],
                    outputs: list[jax.Array] | None) -> Any:
    """An :data:`~npujax.ir.execute.Observe` hook: adds ``offsets[node]`` (``(batch, ...)``, the
    shape of the node's first input) to the first input of each node it names, and records
    that input, ``(input,)``. Zero offsets leave the values alone; the gradient w.r.t. them is
    the loss gradient w.r.t. the activation."""
    if node.name not in offsets:
        return None
    if outputs is None:
        return [inputs[0] + offsets[node.name], *inputs[1:]]
    return (inputs[0],)


def activation_sensitivity(
    graph: Graph,
    params: Params,
    x: jax.Array,
    y: jax.Array,
    layers: Sequence[str],
    candidates: Sequence[int],
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
) -> dict[str, dict[int, float]]:
    """Empirical-Fisher sensitivity of each layer's input activation to ``a``-bit quantization.

    ``Omega_l(a) = E[||dL/dx_l||^2] / n_l * ||Q_a(x_l) - x_l||^2``: the mean squared loss
    gradient w.r.t. the activation (the empirical Fisher approximation of the Hessian diagonal,
    as in HAWQ's activation analysis) times the quantization noise power at ``a`` bits on the
    batch's own min-max range (unsigned, asymmetric, as :func:`npujax.quant_spec`).

    Args:
      graph: the float model.
      params: its params.
      x: a batch of inputs.
      y: the targets of ``loss_fn`` (integer labels by default).
      layers: GEMM layers to analyse.
      candidates: activation widths.
      loss_fn: ``loss_fn(output, y) -> f32[]``; softmax cross-entropy by default. (A
        distillation loss has zero gradient at the teacher: pass sampled targets, see
        :func:`npujax.search.objective.fisher_targets`.)

    Returns:
      ``{layer: {bits: Omega}}``.
    """
    loss_fn = cross_entropy if loss_fn is None else loss_fn
    layers, bits = list(layers), [int(b) for b in candidates]
    shapes = {n: graph.tensors[graph.node(n).inputs[0]].shape[1:] for n in layers}

    @jax.jit  # one program for every layer and width (eagerly, each op compiled per shape)
    def omega(params, x, y):
        zeros = {n: jnp.zeros((x.shape[0], *shapes[n]), jnp.float32) for n in layers}

        def loss(offsets):
            out, taps = execute(graph, params, x, observe=Partial(_offset_and_tap, offsets))
            return loss_fn(out, y), taps

        grads, taps = jax.grad(loss, has_aux=True)(zeros)
        fisher: dict[str, jax.Array] = {}
        noise: dict[str, list[jax.Array]] = {}
        for n in layers:
            act = taps[n][0]
            fisher[n] = jnp.mean(jnp.square(grads[n]))
            lo, hi = jnp.min(act), jnp.max(act)
            noise[n] = []
            for b in bits:
                fmt = IntFormat(b, signed=False)
                sb, zb = qparams_from_range(lo, hi, fmt, symmetric=False)
                noise[n].append(jnp.sum(jnp.square(fake_quant(act, sb, zb, fmt) - act)))
        return fisher, noise

    fisher, noise = jax.device_get(omega(params, x, y))
    return {n: {b: float(fisher[n]) * float(noise[n][j]) / x.shape[0] for j, b in enumerate(bits)}
            for n in layers}


def weight_perturbation(
    graph: Graph, params: Params, layers: Sequence[str], candidates: Sequence[int]
) -> dict[str, dict[int, float]]:
    """``||Q_b(W_l) - W_l||_2^2`` of each layer's kernel for each candidate width ``b``.

    ``Q_b`` is the scheme :func:`npujax.quant_spec` uses: signed, narrow-range, symmetric,
    per output channel.
    """
    layers, bits = list(layers), [int(b) for b in candidates]
    axes = {n: kernel_out_axis(graph.node(n)) for n in layers}

    @jax.jit  # one program for every layer and width
    def perturbation(kernels):
        return {n: [jnp.sum(jnp.square(quantize_weight(
            kernels[n], IntFormat(b, narrow_range=True), axes[n]) - kernels[n])) for b in bits]
            for n in layers}

    table = jax.device_get(perturbation({n: params[n]["kernel"] for n in layers}))
    return {n: {b: float(table[n][j]) for j, b in enumerate(bits)} for n in layers}


def hawq_sensitivity(
    traces: dict[str, float], perturbation: dict[str, dict[int, float]]
) -> dict[str, dict[int, float]]:
    """HAWQ-V3's ``Omega_l(b) = Tr(H_ll)/n_l * ||Q_b(W_l) - W_l||^2`` (traces clipped at 0)."""
    return {n: {b: max(traces[n], 0.0) * p for b, p in perturbation[n].items()}
            for n in perturbation}


def loss_sensitivity(
    graph: Graph,
    params: Params,
    x: jax.Array,
    y: jax.Array,
    layers: Sequence[str],
    candidates: Sequence[int],
    act_candidates: Sequence[int],
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
    *,
    reference_bits: int = 16,
    progress: bool = False,
) -> dict[str, dict[tuple[int, int], float]]:
    """Measured loss increase when one layer alone is quantized at each (weight, act) pair.

    ``Omega_l(w, a) = L(layer l at (w, a), every other layer at reference_bits) - L(all layers at
    reference_bits)`` on the batch ``(x, y)``: the per-layer sensitivity analysis of AIMET and
    Sony MCT, and the direct form of what HAWQ's second-order term estimates. It needs no
    Hessian and sees effects a per-weight trace misses (a 2-bit depthwise or 1-input-channel
    layer), at the price of ``len(layers) * len(pairs)`` forward passes -- all through one
    compiled program (the mixture form of :func:`npujax.ir.execute.execute` with one-hot
    probabilities), so the cost is forward passes, not compilations.

    Args:
      graph: the float model.
      params: its params.
      x: a batch of inputs.
      y: the ``loss_fn`` targets.
      layers: GEMM layers to analyse.
      candidates: weight widths.
      act_candidates: activation widths.
      loss_fn: ``loss_fn(output, y) -> f32[]``; softmax cross-entropy by default.
      reference_bits: the width standing in for float on the other layers (16: quantization
        noise far below the candidates').
      progress: show a progress bar.

    Returns:
      ``{layer: {(w, a): Omega}}`` (clipped at 0: a quantization that happens to lower the loss
      on this batch is not rewarded).
    """
    loss_fn = cross_entropy if loss_fn is None else loss_fn
    wc = sorted({int(b) for b in candidates} | {reference_bits})
    ac = sorted({int(b) for b in act_candidates} | {reference_bits})
    names = [n.name for n in quantizable_nodes(graph)]
    q = quant_spec(graph, {n: tuple(wc) for n in names}, {n: tuple(ac) for n in names})
    qstate = calibrate(graph, params, [x], q)

    @jax.jit
    def loss_of(wi, ai, params, x, y):  # wi, ai: int32 [n_layers] candidate index per layer
        bp = {n: jax.nn.one_hot(wi[i], len(wc), dtype=jnp.float32) for i, n in enumerate(names)}
        ap = {n: jax.nn.one_hot(ai[i], len(ac), dtype=jnp.float32) for i, n in enumerate(names)}
        qs = set_probabilities(q, qstate, bp, ap)
        return loss_fn(execute(graph, params, x, quant=q, qstate=qs), y)

    def loss(wi, ai):  # the data as arguments: a batch sharded over devices stays sharded
        return loss_of(wi, ai, params, x, y)

    ref_w = np.full(len(names), wc.index(reference_bits), np.int32)
    ref_a = np.full(len(names), ac.index(reference_bits), np.int32)
    base = float(loss(ref_w, ref_a))
    out: dict[str, dict[tuple[int, int], float]] = {}
    for layer in track(list(layers), "loss sensitivity", progress):
        i = names.index(layer)
        out[layer] = {}
        for w in candidates:
            for a in act_candidates:
                wi, ai = ref_w.copy(), ref_a.copy()
                wi[i], ai[i] = wc.index(int(w)), ac.index(int(a))
                out[layer][(int(w), int(a))] = max(float(loss(wi, ai)) - base, 0.0)
    return out


def layer_sensitivity(problem: SearchProblem, config: SearchConfig
                      ) -> dict[str, dict[tuple[int, int], float]]:
    """``{layer: {(w, a): Omega}}`` for the sensitivity searchers (``config.sensitivity``).

    ``hessian``: HAWQ-V3's weight term (Hutchinson trace x perturbation) plus the
    empirical-Fisher activation term (a GEMM of two activations, which has no kernel: its
    measured loss increase); ``loss``: the measured loss increase (:func:`loss_sensitivity`).
    Both on the first ``config.sensitivity_batch`` examples.
    """
    graph, params, task = problem.graph, problem.params, problem.task
    layers = list(problem.table.layers)
    n = min(config.sensitivity_batch, len(problem.x))
    xb = jnp.asarray(problem.x[:n], jnp.float32)
    yb = jnp.asarray(problem.targets[:n])
    dp = data_parallel(config.devices)
    if dp is not None:  # the batch split over the devices, params on every one
        xb, yb = dp.shard((xb, yb), "sensitivity batch")
        params = dp.replicate(params)
    cands, acts = config.candidates, config.act_candidates
    if config.sensitivity == "loss":
        return loss_sensitivity(graph, params, xb, yb, layers, cands, acts, loss_fn=task,
                                progress=config.progress)
    # GEMMs of two activations (attention) have no kernel, so no Hessian trace: their two
    # operands' sensitivity is measured (the loss increase, as "loss" does)
    kernels = [ln for ln in layers if "kernel" in params.get(ln, {})]
    operands = [ln for ln in layers if ln not in kernels]
    out = loss_sensitivity(graph, params, xb, yb, operands, cands, acts, loss_fn=task,
                           progress=config.progress) if operands else {}
    if not kernels:
        return out
    traces = hessian_traces(lambda p, b: task(execute(graph, p, b[0]), b[1]), params,
                            (xb, yb), kernels, samples=config.sensitivity_samples,
                            seed=config.seed, progress=config.progress)
    fisher_y = jnp.asarray(fisher_targets(problem.targets[:n], task, config.seed))
    if dp is not None:
        fisher_y = dp.shard(fisher_y, "sensitivity batch")
    w_omega = hawq_sensitivity(traces, weight_perturbation(graph, params, kernels, cands))
    a_omega = activation_sensitivity(
        graph, params, xb, fisher_y, kernels, acts, loss_fn=task)
    out.update({ln: {(w, a): w_omega[ln][w] + a_omega[ln][a] for w in cands for a in acts}
                for ln in kernels})
    return out


def most_sensitive_layers(
    graph: Graph,
    params: Params,
    x: Any,
    weight_bits: int,
    act_bits: int,
    count: int,
    *,
    batch_size: int = 64,
) -> list[LayerSensitivity]:
    """The ``count`` layers whose weights or inputs at the given widths move the model's output
    most, each measured alone (:func:`npujax.quantize.sensitivity.sensitivity_split`).

    Every GEMM layer is quantized at ``weight_bits``/``act_bits`` (:func:`npujax.quant_spec`),
    calibrated (min-max) on ``x``, and ranked by the lower of its weight-only and
    activation-only model-output SQNR. This replaces a fixed "first and last layer" choice by a
    measured one (the first and last layers are often, not always, the most sensitive: Nagel et
    al. 2021, arXiv:2106.08295, section 4.3).

    Args:
      graph: the float model.
      params: its params.
      x: float32 inputs ``(n, ...)`` (a few hundred examples are plenty).
      weight_bits: the width the search would go down to for weights (its narrowest).
      act_bits: the same for input activations.
      count: how many layers to return (at most the number of layers).
      batch_size: examples per forward pass.

    Returns:
      The ``count`` most sensitive :class:`~npujax.quantize.sensitivity.LayerSensitivity`
      rows, most sensitive first.

    Raises:
      ConfigError: ``count`` < 1.
      CalibrationError: no examples, NaN/inf inputs.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"count must be a positive int, got {count!r}.")
    q = quant_spec(graph, weight_bits, act_bits)
    batches = [x[i:i + batch_size] for i in range(0, len(x), batch_size)]
    qstate = calibrate(graph, params, batches, q)
    return sensitivity_split(graph, params, q, qstate, batches)[:count]
