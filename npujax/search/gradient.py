"""Mixed-precision search by gradient: learned per-layer bit widths under a latency budget.

Each GEMM layer ``l`` holds logits ``alpha_l`` over candidate weight widths; its weight is the
probability-weighted mixture of the fake-quantized weights at each width (EdMIPS: Cai and
Vasconcelos, "Rethinking Differentiable Search for Mixed-Precision Neural Networks", CVPR 2020).
Weights and logits are trained jointly on

    loss = cross_entropy + lambda * E[latency] / latency_int8,

with ``E[latency]`` the relaxed NPU latency of :mod:`npujax.search.cost`. ``lambda`` is the
Lagrange multiplier of the budget constraint ``E[latency] <= budget``, updated by projected dual
ascent, ``lambda <- max(0, lambda + eta * (E[latency] / budget - 1))`` from ``lambda = 0``: it grows
only while the expected latency is over the budget, so the search narrows layers only as far as the
budget requires (a multiplier that starts high pushes every layer to the narrowest width, and the
task loss of a robust model hardly pushes back).

The policy is decoded as the most probable one that meets the budget: ``argmin sum_l -log p_l(b_l)``
subject to the exact latency ``<= budget`` (the integer program of :func:`ilp_policy`). When the
per-layer argmax meets the budget it is that argmax; otherwise the layers whose probabilities are
least decided give way first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from npujax._progress import progress_bar
from npujax.errors import ConfigError
from npujax.hw.spec import NpuSpec
from npujax.ir.graph import Graph, Params
from npujax.quantize.calibrate import calibrate
from npujax.quantize.execute import execute
from npujax.quantize.quantizers import init_states
from npujax.quantize.quantizers.mixture import set_probabilities
from npujax.quantize.spec import quant_spec
from npujax.quantize.train import batch_iterator, cross_entropy
from npujax.search.cost import (
    LatencyTable,
    expected_latency,
    latency_table,
    policy_latency_s,
)
from npujax.search.solvers import (
    Pinned,
    allowed_mask,
    check_budget,
    fit_exact_budget,
    ilp_policy,
)

__all__ = ["SearchResult", "gradient_search"]


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """Outcome of :func:`gradient_search`.

    Attributes:
      policy: ``{layer: weight_bits}``, the most probable choice that meets the budget.
      probs: ``{layer: f32[n]}`` final selection probabilities over ``table.candidates``.
      latency_s: exact modelled latency of ``policy`` (:func:`npujax.plan.lower`, s).
      budget_s: the latency budget the search aimed at (s).
      lam: final latency weight.
      params: the weights after the joint search (a good start for fine-tuning).
      table: the per-layer, per-candidate latency table used.
      act_policy: ``{layer: act_bits}`` chosen with ``policy``.
      act_probs: ``{layer: f32[n_a]}`` final probabilities over the activation candidates.
    """

    policy: dict[str, int]
    probs: dict[str, np.ndarray]
    latency_s: float
    budget_s: float
    lam: float
    params: Params
    table: LatencyTable
    act_policy: dict[str, int]
    act_probs: dict[str, np.ndarray]


def gradient_search(
    graph: Graph,
    params: Params,
    x: np.ndarray,
    y: np.ndarray,
    spec: NpuSpec,
    qstate: Mapping[str, Mapping[str, jax.Array]],
    *,
    candidates: Sequence[int] = (2, 4, 8),
    act_bits: int | Sequence[int] = 8,
    budget_s: float | None = None,
    budget_ratio: float = 0.8,
    lam: float = 0.0,
    dual_rate: float = 0.05,
    steps: int = 300,
    learning_rate: float = 1e-4,
    logits_learning_rate: float = 0.05,
    batch_size: int = 64,
    seed: int = 0,
    dataflow: str | None = None,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy,
    pinned: Pinned | None = None,
    progress: bool = False,
) -> SearchResult:
    """Learn per-layer weight (and activation) widths against the NPU latency of ``spec``.

    Args:
      graph, params: optimized float model (BN folded) and its params.
      x, y: training data: float32 inputs and targets of ``loss_fn`` (integer labels by
        default; teacher outputs for distillation, see :mod:`npujax.search.objective`).
      spec: the NPU whose latency model is the cost.
      qstate: calibrated activation ranges. With several activation candidates the search
        re-calibrates (min-max over the first 512 examples of ``x``) to get one grid per
        candidate over the same range.
      candidates: candidate weight widths (each 2..16).
      act_bits: activation width of every layer, or a sequence of candidate widths: each layer's
        input is then also a learned mixture (EdMIPS searches both operands), and the latency
        relaxation takes the joint probabilities ``p_w(w) * p_a(a)``.
      budget_s: latency budget (s); default ``budget_ratio x`` the uniform ``max(candidates)``
        latency.
      budget_ratio: see ``budget_s``; in (0, 1].
      lam: initial latency weight (Lagrange multiplier, >= 0).
      dual_rate: step of the dual-ascent update of ``lam``.
      steps: joint optimisation steps.
      learning_rate, logits_learning_rate: Adam rates for weights and bit logits.
      batch_size, seed: mini-batching.
      dataflow: overrides the preset's dataflow.
      loss_fn: task loss ``loss_fn(output, target_batch) -> f32[]``; softmax cross-entropy by
        default.
      pinned: ``{layer: w or (w, a)}`` layers held at one choice (their probabilities are
        one-hot throughout).
      progress: show a progress bar.

    Returns:
      A :class:`SearchResult`.

    Raises:
      ConfigError: empty candidates, or a budget below the fastest policy the candidates allow.
    """
    candidates = tuple(sorted(int(b) for b in candidates))
    acts = tuple(sorted({int(b) for b in (act_bits if isinstance(act_bits, Sequence)
                                          else (act_bits,))}))
    if not candidates or not acts:
        raise ConfigError("candidates and act_bits must name at least one width, e.g. (2, 4, 8).")
    table = latency_table(graph, spec, candidates, acts, dataflow)
    reference = table.latency_s({n: (max(candidates), max(acts)) for n in table.layers})
    if budget_s is None:
        if not 0 < budget_ratio <= 1:
            raise ConfigError(f"budget_ratio must be in (0, 1], got {budget_ratio}.")
        budget_s = budget_ratio * reference
    fastest = check_budget(table, budget_s, pinned)
    allowed = allowed_mask(table, pinned).reshape(len(table.layers), len(candidates), len(acts))
    # additive logit masks: 0 where allowed, -1e9 (probability exactly 0) elsewhere
    wmask = {n: jnp.asarray(np.where(allowed[i].any(1), 0.0, -1e9), jnp.float32)
             for i, n in enumerate(table.layers)}
    amask = {n: jnp.asarray(np.where(allowed[i].any(0), 0.0, -1e9), jnp.float32)
             for i, n in enumerate(table.layers)}
    if lam < 0:
        raise ConfigError(f"lam must be >= 0, got {lam}.")
    mixed_acts = len(acts) > 1
    quant = quant_spec(graph, {n: candidates for n in table.layers},
                       {n: acts if mixed_acts else acts[0] for n in table.layers})
    if mixed_acts:
        xc = np.asarray(x[:512], np.float32)
        qstate = calibrate(graph, params, [xc[i:i + 64] for i in range(0, len(xc), 64)], quant)
    else:  # the calibrated grids, as states of the mixture quantizer
        qstate = init_states(graph, params, quant, qstate)
    logits = {n: jnp.zeros(len(candidates), jnp.float32) for n in table.layers}
    act_logits = {n: jnp.zeros(len(acts), jnp.float32) for n in table.layers}
    opt = optax.multi_transform(
        {"w": optax.adam(learning_rate), "a": optax.adam(logits_learning_rate)},
        {"w": jax.tree.map(lambda _: "w", params), "a": jax.tree.map(lambda _: "a", logits),
         "x": jax.tree.map(lambda _: "a", act_logits)},
    )
    state = {"w": params, "a": logits, "x": act_logits}
    opt_state = opt.init(state)

    def probs_of(a, mask):
        return {n: jax.nn.softmax(v + mask[n]) for n, v in a.items()}

    def joint(pw, pa):  # [L, n_w * n_a] in the table's (w-major) column order
        return jnp.stack([jnp.outer(pw[n], pa[n]).reshape(-1) for n in table.layers])

    @jax.jit
    def step(state, opt_state, lam, xb, yb):
        def objective(s):
            probs, aprobs = probs_of(s["a"], wmask), probs_of(s["x"], amask)
            qs = set_probabilities(quant, qstate, probs, aprobs)
            out = execute(graph, s["w"], xb, quant=quant, qstate=qs)
            lat = expected_latency(joint(probs, aprobs), table)
            return loss_fn(out, yb) + lam * lat / reference, lat

        (loss, lat), grads = jax.value_and_grad(objective, has_aux=True)(state)
        updates, opt_state = opt.update(grads, opt_state, state)
        lam = jnp.clip(lam + dual_rate * (lat / budget_s - 1.0), 0.0, 1e4)
        return optax.apply_updates(state, updates), opt_state, lam, loss

    lam_arr = jnp.asarray(lam, jnp.float32)
    batches = batch_iterator(x, y, batch_size, seed)
    with progress_bar(progress, "precision search", steps) as advance:
        for _ in range(steps):
            xb, yb = next(batches)
            state, opt_state, lam_arr, loss = step(state, opt_state, lam_arr, xb, yb)
            advance(loss)
    probs = {n: np.asarray(p) for n, p in probs_of(state["a"], wmask).items()}
    aprobs = {n: np.asarray(p) for n, p in probs_of(state["x"], amask).items()}

    def nlog(v):
        return -float(np.log(max(float(v), 1e-30)))

    nll = {n: {(w, a): nlog(probs[n][i]) + nlog(aprobs[n][j]) for i, w in enumerate(candidates)
               for j, a in enumerate(acts)} for n in table.layers}
    choice, exact = fit_exact_budget(lambda b: ilp_policy(table, nll, b, pinned),
                                     lambda c: policy_latency_s(graph, spec, c, dataflow),
                                     budget_s, fastest)
    policy = {n: int(c[0]) for n, c in choice.items()}
    act_policy = {n: int(c[1]) for n, c in choice.items()}
    return SearchResult(policy, probs, exact, float(budget_s),
                        float(lam_arr), state["w"], table, act_policy, aprobs)
