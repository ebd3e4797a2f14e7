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
subject to the exact latency ``<= budget`` (the integer program of
:func:`npujax.search.ilp.ilp_policy`). When the
per-layer argmax meets the budget it is that argmax; otherwise the layers whose probabilities are
least decided give way first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, final

import jax
import jax.numpy as jnp
import numpy as np
import optax

from npujax._progress import progress_bar
from npujax.ir.execute import execute
from npujax.ops import operand_quantized_ops
from npujax.quantize.calibrate import calibrate
from npujax.quantize.parallel import data_parallel
from npujax.quantize.quantizers import init_states
from npujax.quantize.quantizers.mixture import set_probabilities
from npujax.quantize.spec import quant_spec
from npujax.quantize.train import batch_iterator, to_device
from npujax.search.base import Searcher, SearchOutcome, SearchProblem
from npujax.search.cost import expected_latency
from npujax.search.ilp import ilp_policy
from npujax.search.solvers import allowed_mask, fit_policy

if TYPE_CHECKING:
    from npujax.search.config import SearchConfig

__all__ = ["GradientSearcher"]


@final
class GradientSearcher(Searcher):
    """Learned per-layer weight and activation widths (EdMIPS) under a latency budget.

    Its outcome's details: ``probabilities`` and ``act_probabilities`` (``{layer: [p]}`` over
    ``candidates`` and ``act_candidates``), ``final_lambda``; its ``params`` are the weights
    after the joint search (a good start for fine-tuning). With several activation candidates
    the model is re-calibrated (min-max over the first 512 examples) to get one grid per
    candidate over the same range.
    """

    name = "gradient"
    summary = "learned widths by gradient (EdMIPS) with a latency multiplier"

    def search(self, problem: SearchProblem, config: SearchConfig) -> SearchOutcome:
        graph, params, table = problem.graph, problem.params, problem.table
        x, y, loss_fn = problem.x, problem.targets, problem.task
        candidates, acts = config.candidates, config.act_candidates
        budget_s = problem.budget_s
        reference = table.latency_s({n: (max(candidates), max(acts)) for n in table.layers})
        allowed = allowed_mask(table, problem.pinned).reshape(len(table.layers),
                                                              len(candidates), len(acts))
        # additive logit masks: 0 where allowed, -1e9 (probability exactly 0) elsewhere
        # (made on the host and device_put: an eager conversion or fill, and jnp.asarray of a
        # numpy array, compile one program per shape)
        wmask = {n: jax.device_put(np.where(allowed[i].any(1), 0.0, -1e9).astype(np.float32))
                 for i, n in enumerate(table.layers)}
        amask = {n: jax.device_put(np.where(allowed[i].any(0), 0.0, -1e9).astype(np.float32))
                 for i, n in enumerate(table.layers)}
        mixed_acts = len(acts) > 1
        quant = quant_spec(graph, {n: candidates for n in table.layers},
                           {n: acts if mixed_acts else acts[0] for n in table.layers})
        # mixed activation widths and the operands of GEMMs of two activations (attention)
        # need one grid per candidate, from the observed ranges: calibrate with this spec
        operands = any(graph.node(n).op in operand_quantized_ops() for n in table.layers)
        if mixed_acts or operands:
            xc = np.asarray(x[:512], np.float32)
            qstate = calibrate(graph, params, [xc[i:i + 64] for i in range(0, len(xc), 64)],
                               quant)
        else:  # the calibrated grids, as states of the mixture quantizer
            qstate = init_states(graph, params, quant, problem.qstate)
        logits = {n: jax.device_put(np.zeros(len(candidates), np.float32)) for n in table.layers}
        act_logits = {n: jax.device_put(np.zeros(len(acts), np.float32)) for n in table.layers}
        opt = optax.multi_transform(
            {"w": optax.adam(config.learning_rate), "a": optax.adam(config.logits_learning_rate)},
            {"w": jax.tree.map(lambda _: "w", params), "a": jax.tree.map(lambda _: "a", logits),
             "x": jax.tree.map(lambda _: "a", act_logits)},
        )
        state: dict[str, Any] = {"w": params, "a": logits, "x": act_logits}
        opt_state = jax.jit(opt.init)(state)  # (eagerly: Adam's zeros, one program per shape)

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
            lam = jnp.clip(lam + config.dual_rate * (lat / budget_s - 1.0), 0.0, 1e4)
            return optax.apply_updates(state, updates), opt_state, lam, loss

        lam_arr = to_device(np.float32(config.lam))
        batches = batch_iterator(x, y, config.batch_size, config.seed)
        place: Callable[[Any], Any] = to_device
        dp = data_parallel(config.devices)
        if dp is not None:  # mini-batches split over the devices, the state on every one
            dp.check(min(config.batch_size, len(x)), "batch_size")
            state, opt_state, lam_arr = dp.replicate((state, opt_state, lam_arr))
            place = dp.shard
        with progress_bar(config.progress, "precision search", config.steps) as advance:
            for _ in range(config.steps):
                xb, yb = next(batches)
                state, opt_state, lam_arr, loss = step(state, opt_state, lam_arr, place(xb),
                                                       place(yb))
                advance(loss)
        # eager, as reported so far (a jitted softmax fuses: it can differ in the last bit)
        probs = {n: np.asarray(p) for n, p in probs_of(state["a"], wmask).items()}
        aprobs = {n: np.asarray(p) for n, p in probs_of(state["x"], amask).items()}

        def nlog(v):
            return -float(np.log(max(float(v), 1e-30)))

        nll = {n: {(w, a): nlog(probs[n][i]) + nlog(aprobs[n][j])
                   for i, w in enumerate(candidates) for j, a in enumerate(acts)}
               for n in table.layers}
        choice = fit_policy(problem, config.dataflow,
                            lambda b: ilp_policy(table, nll, b, problem.pinned))
        details = {"probabilities": {n: [float(v) for v in p] for n, p in probs.items()},
                   "act_probabilities": {n: [float(v) for v in p] for n, p in aprobs.items()},
                   "candidates": list(candidates), "act_candidates": list(acts),
                   "final_lambda": float(lam_arr)}
        return SearchOutcome(choice, details, params=state["w"])
