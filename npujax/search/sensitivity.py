"""Per-layer sensitivity to quantization: Hessian trace (Hutchinson) and weight perturbation.

* **Hessian trace** (HAWQ-V2: Dong et al., NeurIPS 2020, arXiv:1911.03852). For the loss ``L`` and
  the kernel ``W_l`` of layer ``l``, ``Tr(H_ll) = E_v[v_l^T (H v)_l]`` for Rademacher ``v``
  (Hutchinson 1990). ``H v`` is a Hessian-vector product computed forward-over-reverse
  (``jax.jvp`` of ``jax.grad``), so one product per sample gives every layer's trace at once
  (cross terms vanish in expectation). Reported as the mean per weight, ``Tr(H_ll) / n_l``.
* **Activations**: the empirical-Fisher analogue for each layer's input activation,
  :func:`activation_sensitivity`.
* **Perturbation** ``||Q_b(W_l) - W_l||_2^2`` of the symmetric per-channel quantizer at ``b``
  bits, and the HAWQ-V3 sensitivity ``Omega_l(b) = Tr(H_ll)/n_l * ||Q_b(W_l) - W_l||^2`` that the
  integer program minimises (Yao et al., ICML 2021, arXiv:2011.10680).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import ConfigError
from npujax.graph.execute import execute, quantize_weight
from npujax.graph.ir import Graph, Params
from npujax.graph.ops import kernel_out_axis
from npujax.quant import IntFormat

__all__ = ["hessian_traces", "activation_sensitivity", "weight_perturbation", "hawq_sensitivity"]


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
    for i in _maybe_track(range(samples), "Hessian trace", progress):
        total += np.asarray(probe(keys[i], params, batch), np.float64)
    sizes = np.asarray([params[n]["kernel"].size for n in layers], np.float64)
    return {n: float(t) for n, t in zip(layers, total / samples / sizes)}


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
    batch's own min-max range (unsigned, asymmetric, as :func:`npujax.graph.quant_spec`).

    Args:
      graph, params: the float model.
      x, y: a batch of inputs and the targets of ``loss_fn`` (integer labels by default).
      layers: GEMM layers to analyse.
      candidates: activation widths.
      loss_fn: ``loss_fn(output, y) -> f32[]``; softmax cross-entropy by default. (A
        distillation loss has zero gradient at the teacher: pass sampled targets, see
        :func:`npujax.search.objective.fisher_targets`.)

    Returns:
      ``{layer: {bits: Omega}}``.
    """
    from npujax.quant import fake_quant, qparams_from_range
    if loss_fn is None:
        from npujax.train import cross_entropy as loss_fn

    zeros = {n: jnp.zeros((x.shape[0], *graph.tensors[graph.node(n).inputs[0]].shape[1:]),
                          jnp.float32) for n in layers}

    def loss(offsets):
        out, taps = execute(graph, params, x, taps=layers, input_offsets=offsets)
        return loss_fn(out, y), taps

    grads, taps = jax.grad(loss, has_aux=True)(zeros)
    out: dict[str, dict[int, float]] = {}
    for n in layers:
        act = taps[n][0]
        fisher = float(jnp.mean(jnp.square(grads[n])))
        lo, hi = jnp.min(act), jnp.max(act)
        out[n] = {}
        for b in candidates:
            fmt = IntFormat(int(b), signed=False)
            sb, zb = qparams_from_range(lo, hi, fmt, symmetric=False)
            noise = float(jnp.sum(jnp.square(fake_quant(act, sb, zb, fmt) - act)))
            out[n][int(b)] = fisher * noise / act.shape[0]
    return out


def _maybe_track(it, description: str, progress: bool):
    import sys

    if progress and sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import track

        return track(it, description=description, transient=True, console=Console(stderr=True))
    return it


def weight_perturbation(
    graph: Graph, params: Params, layers: Sequence[str], candidates: Sequence[int]
) -> dict[str, dict[int, float]]:
    """``||Q_b(W_l) - W_l||_2^2`` of each layer's kernel for each candidate width ``b``.

    ``Q_b`` is the scheme :func:`npujax.graph.quant_spec` uses: signed, narrow-range, symmetric,
    per output channel.
    """
    out: dict[str, dict[int, float]] = {}
    for n in layers:
        w = params[n]["kernel"]
        axis = kernel_out_axis(graph.node(n))
        out[n] = {int(b): float(jnp.sum(jnp.square(
            quantize_weight(w, IntFormat(int(b), narrow_range=True), axis) - w)))
            for b in candidates}
    return out


def hawq_sensitivity(
    traces: dict[str, float], perturbation: dict[str, dict[int, float]]
) -> dict[str, dict[int, float]]:
    """HAWQ-V3's ``Omega_l(b) = Tr(H_ll)/n_l * ||Q_b(W_l) - W_l||^2`` (traces clipped at 0)."""
    return {n: {b: max(traces[n], 0.0) * p for b, p in perturbation[n].items()}
            for n in perturbation}
