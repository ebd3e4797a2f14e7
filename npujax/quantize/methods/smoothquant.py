"""SmoothQuant: migrate activation outliers into the weights (Xiao et al. 2023).

A transformer's linear-layer inputs have a few channels with values far larger than the rest,
so a per-tensor activation grid spends its codes on them; the weights are easy to quantize.
SmoothQuant divides input channel ``j`` by ``s_j`` and multiplies the weight's row ``j`` by it,
``Y = (X diag(s)^-1) (diag(s) W)``, the float function unchanged, with (section 4)

    ``s_j = max |X_j|^alpha / max |W_j|^(1 - alpha)``

``max |X_j|`` over the calibration data, ``max |W_j|`` over the layer's outputs (over all the
layers that read the same tensor: the Q, K and V projections share one ``s``), ``alpha`` the
migration strength (0.5 by default; the paper uses 0.5 for OPT and BLOOM, up to 0.75-0.85 for
GLM-130B and Llama-like models). Scales are kept at least 1e-5 and are 1 for a channel that is
always zero.

Where ``diag(s)^-1`` goes:

* **folded into the producer**, where the Gemm inputs are a LayerNormalization or
  RMSNormalization output read only by quantized Gemms (the inputs of attention's Q/K/V
  projections and of the MLP's first layer in a pre-norm block): the normalization's ``scale``
  and ``bias`` are divided by ``s`` (the paper's choice: no extra operator);
* otherwise (``unfoldable="mul"``) an explicit ``Mul`` by the constant ``1 / s`` is inserted
  before the Gemm(s) and kept in the graph (and in the exported ONNX): a float per-channel
  multiply on the vector unit, e.g. before an MLP's second layer after GELU or an attention
  output projection; with ``unfoldable="skip"`` (the default, as the paper's code) those
  inputs are left alone.

Layers: Gemm nodes of ``quant`` with an input (activation) format and a weight format (the
paper's W8A8 setting).

References:
  Xiao, Lin, Seznec, Wu, Demouth, Han 2023, "SmoothQuant: Accurate and Efficient Post-Training
  Quantization for Large Language Models", arXiv:2211.10438, section 4 (the smoothing, the
  migration strength alpha, folding into the previous LayerNorm, Figure 6).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from npujax.ir.execute import execute, tap
from npujax.ir.graph import Graph, Node, Params, TensorType, fresh_name
from npujax.quantize.methods._common import check_batches, copy_params, is_number, require
from npujax.quantize.methods.base import PTQMethod, PTQStep, Stage
from npujax.quantize.spec import QuantSpec

__all__ = ["SmoothQuant", "smoothing_scales"]

#: Normalizations whose per-channel affine output absorbs ``1 / s``.
_NORMS = ("LayerNormalization", "RMSNormalization")
#: Smallest scale (the paper's code clamps at 1e-5).
_MIN = 1e-5


def smoothing_scales(act_absmax: np.ndarray, weight_absmax: np.ndarray, alpha: float
                     ) -> np.ndarray:
    """``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` (SmoothQuant, section 4), float32 ``[K]``.

    Args:
      act_absmax: ``max |X_j|`` per input channel, ``[K]``.
      weight_absmax: ``max |W_j|`` per input channel (over outputs), ``[K]``.
      alpha: the migration strength in [0, 1].

    Returns:
      The scales, at least 1e-5; 1 where the channel's activation or weights are all zero.
    """
    a = np.maximum(np.asarray(act_absmax, np.float64), _MIN)
    w = np.maximum(np.asarray(weight_absmax, np.float64), _MIN)
    s = np.maximum(a ** alpha / w ** (1.0 - alpha), _MIN)
    dead = (np.asarray(act_absmax) == 0) | (np.asarray(weight_absmax) == 0)
    return np.where(dead, 1.0, s).astype(np.float32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SmoothQuant(PTQMethod):
    """SmoothQuant (Xiao et al. 2023; see the module docstring).

    ``pre_calibration``: rewrites the float model (normalization affine, Gemm kernels, and with
    ``unfoldable="mul"`` new ``Mul`` nodes) keeping its function; calibration then observes
    the smoothed activations.

    Attributes:
      alpha: the migration strength in [0, 1] (paper default 0.5).
      unfoldable: ``"skip"`` (default) or ``"mul"``: what to do with Gemm inputs that no
        normalization produces.

    Raises:
      ConfigError: a field out of range (named).
    """

    name: ClassVar[str] = "smoothquant"
    stage: ClassVar[Stage] = "pre_calibration"

    alpha: float = 0.5
    unfoldable: str = "skip"

    def __post_init__(self) -> None:
        require(is_number(self.alpha) and 0 <= self.alpha <= 1, "SmoothQuant", "alpha",
                self.alpha, "a number in [0, 1] (paper: 0.5)")
        require(self.unfoldable in ("skip", "mul"), "SmoothQuant", "unfoldable",
                self.unfoldable, "'skip' or 'mul'")

    def apply(self, graph: Graph, params: Params, quant: QuantSpec,
              batches: Sequence[ArrayLike], qstate: dict[str, Any] | None) -> PTQStep:
        """Smooth the inputs of every W8A8-style Gemm of ``quant``.

        Returns:
          A :class:`~npujax.quantize.methods.PTQStep` (a new graph when ``Mul`` nodes are
          inserted); per input tensor a note ``"ln1 -> q, k, v: folded into the
          LayerNormalization, activation max/median channel 41.0 -> 6.4"``.

        Raises:
          CalibrationError: empty, NaN or inf batches.
        """
        data = check_batches(batches, "SmoothQuant")
        layers = [n for n in graph.nodes if n.op == "Gemm" and n.name in quant
                  and quant[n.name].act is not None and quant[n.name].weight_candidates]
        by_input: dict[str, list[Node]] = {}
        for n in layers:
            by_input.setdefault(n.inputs[0], []).append(n)
        absmax = self._act_absmax(graph, params, data, [ns[0].name for ns in by_input.values()])
        p = copy_params(params)
        notes: list[str] = []
        nodes = list(graph.nodes)
        tensors = dict(graph.tensors)
        constants = dict(graph.constants)
        taken = set(tensors) | {n.name for n in nodes}
        for t, users in by_input.items():
            names = ", ".join(u.name for u in users)
            xmax = absmax[users[0].name]
            wmax = np.max([np.max(np.abs(np.asarray(p[u.name]["kernel"])), axis=1)
                           for u in users], axis=0)
            s = smoothing_scales(xmax, wmax, self.alpha)
            prod = graph.producer(t)
            fold = (prod is not None and prod.op in _NORMS and t not in graph.outputs
                    and {c.name for c in graph.consumers(t)} == {u.name for u in users}
                    and self._affine_ok(prod, p, s.size))
            if not fold and self.unfoldable == "skip":
                notes.append(f"{t} -> {names}: not smoothed (no normalization to fold into; "
                             "unfoldable='mul' inserts a Mul)")
                continue
            if fold:
                assert prod is not None
                aff = dict(p.get(prod.name, {}))
                aff["scale"] = jax.device_put(
                    np.asarray(aff.get("scale", np.ones(s.size, np.float32)), np.float32) / s)
                if "bias" in aff:
                    aff["bias"] = jax.device_put(np.asarray(aff["bias"], np.float32) / s)
                p[prod.name] = aff
                if "scale" not in prod.params:
                    i = nodes.index(prod)
                    nodes[i] = prod.replace(params=(*prod.params, "scale"))
                where = f"folded into {prod.op} {prod.name!r}"
            else:
                cname = fresh_name(f"{t}/smooth_scale", taken)
                out = fresh_name(f"{t}/smoothed", taken)
                constants[cname] = (1.0 / s).astype(np.float32)
                tensors[cname] = TensorType((s.size,), "float32")
                tensors[out] = tensors[t]
                mul = Node(fresh_name(f"{users[0].name}/smooth", taken), "Mul", (t, cname),
                           (out,))
                first = min(nodes.index(u) for u in users)
                nodes.insert(first, mul)
                for u in users:
                    i = nodes.index(u)
                    nodes[i] = u.replace(inputs=(out, *u.inputs[1:]))
                where = "an explicit Mul"
            for u in users:
                p[u.name]["kernel"] = jax.device_put(
                    np.asarray(p[u.name]["kernel"], np.float32) * s[:, None])
            before = float(np.max(xmax) / max(np.median(xmax), 1e-30))
            after_x = xmax / s
            after = float(np.max(after_x) / max(np.median(after_x), 1e-30))
            notes.append(f"{t} -> {names}: {where}, activation max/median channel "
                         f"{before:.3g} -> {after:.3g}")
        if not by_input:
            notes.append("smoothquant: no Gemm with quantized inputs and weights")
        new_graph = graph.replace(nodes=tuple(nodes), tensors=tensors, constants=constants)
        return PTQStep(new_graph, p, quant, qstate, tuple(notes))

    @staticmethod
    def _affine_ok(norm: Node, p: Params, k: int) -> bool:
        """The normalization's affine is per channel of the last axis (shape ``[k]``; one
        that is absent becomes so)."""
        return all(np.shape(v) == (k,) for r, v in p.get(norm.name, {}).items()
                   if r in ("scale", "bias"))

    @staticmethod
    def _act_absmax(graph: Graph, params: Params, data: list[np.ndarray], names: list[str]
                    ) -> dict[str, np.ndarray]:
        """``max |x_j|`` per last-axis channel of each layer's input (float model)."""
        if not names:
            return {}

        def run(p, x):
            _, taps = execute(graph, p, x, observe=tap(names))
            return {n: jnp.max(jnp.abs(taps[n][0].reshape(-1, taps[n][0].shape[-1])), axis=0)
                    for n in names}

        fn = jax.jit(run)
        out: dict[str, np.ndarray] = {}
        for x in data:
            for n, v in jax.device_get(fn(params, jnp.asarray(x))).items():
                out[n] = np.maximum(out[n], v) if n in out else np.asarray(v)
        return out
