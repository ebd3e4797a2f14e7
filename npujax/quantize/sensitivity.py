"""Per-layer quantization sensitivity split into weights and activations.

For each quantized layer ``l`` the model is run three ways on the same data: in float, with only
layer ``l``'s *weights* quantized (its ``LayerQuant`` with ``act=None``), and with only its *input
activations* quantized (``weight=None``); every other layer stays in float. The sensitivity of an
operand is the SQNR of the model's output,

``SQNR_l = 10 log10(sum_i y_float,i^2 / sum_i (y_l,i - y_float,i)^2)``  (dB, over all batches),

so a low SQNR marks an operand whose quantization alone moves the output most. This is the
per-layer, per-operand analysis of AIMET's quantization analyzer ("per layer sensitivity" with
weights and activations quantized separately) and of Nagel et al. 2021, "A White Paper on Neural
Network Quantization", arXiv:2106.08295, section 4.3 (debugging by quantizing weights and
activations of one layer at a time). It tells whether a layer must keep wide weights, wide
inputs, or both: ``npujax quantize`` reports it, its accuracy-bounded loop returns layers to
higher precision in this order, and ``npujax search --pin sensitive`` keeps the worst layers at
8 bits.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from npujax.errors import CalibrationError, ConfigError
from npujax.ir.execute import execute, layer_state, tap
from npujax.ir.graph import Graph, Params
from npujax.numerics import IntFormat
from npujax.ops import OPS, weight_role
from npujax.quantize.ptq import sqnr_db
from npujax.quantize.spec import LayerQuant, QuantSpec

__all__ = ["LayerSensitivity", "sensitivity_split", "sensitivity_order", "int_bits"]


class LayerSensitivity(NamedTuple):
    """One layer's sensitivity, its weights and its input activations quantized separately.

    Attributes:
      name: the layer (graph node name).
      op: its operator (``Conv``, ``Gemm``, ``MatMul``, ...).
      weight_bits: its weight width (None: float weights, or a non-integer format).
      act_bits: its input-activation width (None: float inputs, or a non-integer format).
      weight_sqnr_db: model-output SQNR (dB) with only this layer's weights quantized (``inf``
        when the layer has no quantized weights or the output does not move).
      act_sqnr_db: model-output SQNR (dB) with only this layer's input activations quantized.
      layer_sqnr_db: SQNR (dB) of this layer's own output with the *whole* model quantized
        (errors accumulated, as deployed; :func:`npujax.quantize.ptq.layer_sqnr`), when asked
        for (``whole_model=True``), else None.
    """

    name: str
    op: str
    weight_bits: int | None
    act_bits: int | None
    weight_sqnr_db: float
    act_sqnr_db: float
    layer_sqnr_db: float | None = None

    @property
    def worst_db(self) -> float:
        """The lower of the two SQNRs: the layer's rank in :func:`sensitivity_order`."""
        return min(self.weight_sqnr_db, self.act_sqnr_db)

    @property
    def dominant(self) -> str:
        """``"weights"`` or ``"activations"``: the operand whose quantization costs more."""
        return "weights" if self.weight_sqnr_db <= self.act_sqnr_db else "activations"


def int_bits(fmt: Any) -> int | None:
    """The width of an integer format; None for a float format or no format (float)."""
    return fmt.bits if isinstance(fmt, IntFormat) else None


def sensitivity_split(
    graph: Graph,
    params: Params,
    quant: QuantSpec,
    qstate: dict[str, Any],
    batches: Iterable[ArrayLike],
    *,
    layers: Sequence[str] | None = None,
    whole_model: bool = False,
    reference_params: Params | None = None,
) -> list[LayerSensitivity]:
    """Each layer's model-output SQNR with only its weights, then only its inputs, quantized.

    All the forward passes (float, and two per layer) run in one compiled program per batch
    shape.

    Args:
      graph: the (BN-folded) model.
      params: its params (after any PTQ method or bias correction: the weights that deploy).
      quant: its quantization spec; layers with a single weight format are analysed.
      qstate: the calibrated states of ``quant``'s layers (:func:`npujax.quantize.calibrate`).
      batches: float32 input batches ``(batch, ...)`` in the model's layout; at least one.
      layers: the layers to analyse (default: every layer of ``quant`` with a quantized
        operand).
      whole_model: also measure each row's ``layer_sqnr_db`` (in the same program).
      reference_params: the float model's params when ``params`` are not (a post-calibration
        method such as AdaRound or GPTQ moved the weights onto the grid, bias correction moved
        the biases): the float output and the activation-only runs use them, a weight-only run
        uses ``params`` for its one layer only, and the whole-model run ``params``. Default:
        ``params``. Measured against
        the rounded weights instead, AdaRound's layers would read 44 dB where they are 19.

    Returns:
      One :class:`LayerSensitivity` per layer, most sensitive first (ascending
      :attr:`LayerSensitivity.worst_db`; ties keep graph order).

    Raises:
      ConfigError: a named layer that is not in ``quant``, or a search mixture (several
        candidate formats: fix the widths first).
      CalibrationError: no batches.

    References:
      Nagel et al. 2021, arXiv:2106.08295, section 4.3; AIMET's ``QuantAnalyzer``
      (per-layer sensitivity with weights or activations quantized).
    """
    if layers is None:
        names = [n for n, lq in quant.items() if lq.weight is not None or lq.act is not None]
    else:
        names = list(layers)
        missing = [n for n in names if n not in quant]
        if missing:
            raise ConfigError(f"sensitivity_split: layers {missing} are not quantized in the "
                              f"spec; its layers are {sorted(quant)}.")
    mixtures = [n for n in names if len(quant[n].weight_candidates) > 1 or
                quant[n].act_candidates]
    if mixtures:
        raise ConfigError(f"sensitivity_split: layers {mixtures} are search mixtures (several "
                          "candidate widths); give each one width (a searched policy).")
    specs: dict[tuple[str, str], dict[str, LayerQuant]] = {}
    for n in names:
        lq = quant[n]
        if lq.weight is not None:
            specs[(n, "weight")] = {n: dataclasses.replace(lq, act=None, act_range=None)}
        if lq.act is not None:
            specs[(n, "act")] = {n: dataclasses.replace(lq, weight=None, operand_range=None)}

    def stats(p, r, x):  # p: the deployed params, r: the float reference's
        ft: dict[str, Any] = {}
        if whole_model:
            yf, ft = execute(graph, r, x, observe=tap(names))
        else:
            yf = execute(graph, r, x)
        out = {"signal": jnp.sum(jnp.square(yf))}
        if specs:
            noise = _isolated_noise(graph, p, r, x, yf, specs, qstate)
            for i, key in enumerate(specs):
                out["/".join(key)] = noise[i]
        if whole_model:
            _, qt = execute(graph, p, x, quant=quant, qstate=qstate, observe=tap(names))
            for n in names:
                out[f"{n}/out_signal"] = jnp.sum(jnp.square(ft[n][1]))
                out[f"{n}/out_noise"] = jnp.sum(jnp.square(qt[n][1] - ft[n][1]))
        return out

    fn = jax.jit(stats)
    acc: dict[str, float] = {}
    count = 0
    for x in batches:
        ref = params if reference_params is None else reference_params
        for k, v in jax.device_get(fn(params, ref, jnp.asarray(x, jnp.float32))).items():
            acc[k] = acc.get(k, 0.0) + float(v)
        count += 1
    if count == 0:
        raise CalibrationError("sensitivity_split needs at least one batch; the iterator was "
                               "empty.")
    rows = []
    for n in names:
        lq = quant[n]
        w = sqnr_db(acc["signal"], acc[f"{n}/weight"]) if f"{n}/weight" in acc else math.inf
        a = sqnr_db(acc["signal"], acc[f"{n}/act"]) if f"{n}/act" in acc else math.inf
        wf = lq.weight_candidates[0] if lq.weight_candidates else None
        whole = sqnr_db(acc[f"{n}/out_signal"], acc[f"{n}/out_noise"]) if whole_model \
            else None
        rows.append(LayerSensitivity(n, graph.node(n).op, int_bits(wf), int_bits(lq.act),
                                     w, a, whole))
    return sensitivity_order(rows)


def _isolated_noise(graph: Graph, p: Params, r: Params, x: jax.Array, yf: jax.Array,
                    specs: dict[tuple[str, str], dict[str, LayerQuant]], qstate: dict[str, Any]
                    ) -> jax.Array:
    """``sum (y_k - y_float)^2`` of every isolated run ``k`` of ``specs`` (in order), each one
    layer's weights (with its deployed params ``p``) or inputs quantized in the float model
    ``r``: what ``execute(graph, {**r, layer: p[layer]} or r, x, quant=specs[k])`` computes,
    as one traced forward pass mapped over ``k`` (``jax.lax.map``) in which every layer's
    operands and params are selected by ``k`` (the quantized ones computed as ``execute`` does,
    the selection exact). One pass instead of one per run: PP-OCR cls's 108 runs were traced,
    lowered and compiled as one program of 108 forward passes (most of ``npujax quantize``'s
    time there)."""
    keys = list(specs)
    index = {key: i for i, key in enumerate(keys)}
    layers = {n for n, _ in keys}
    alt: dict[str, dict[str, Any]] = {}  # per layer: {"weight"|"act": params of that run}
    for (n, kind), q in specs.items():
        node, lq = graph.node(n), q[n]
        base = (p if kind == "weight" else r).get(n)
        if base is None or OPS[node.op].quantized_operands:
            continue  # no params (an attention MatMul: its "weight" is its second operand)
        role = weight_role(node)
        state = layer_state(q, qstate, n)
        alt.setdefault(n, {})[kind] = {**base, role: lq.quantizer.quantize_kernel(
            node, lq, base[role], state)}

    def params_for(k):
        out = dict(r)
        for n, kinds in alt.items():
            # a role a run's params have and the float ones lack (a bias that bias correction
            # added) is zero in the other runs: adding 0 changes nothing
            ref = {role: jnp.asarray(v) for role, v in r.get(n, {}).items()}
            for v in kinds.values():
                ref.update({role: jnp.zeros_like(jnp.asarray(a)) for role, a in v.items()
                            if role not in ref})
            cur = dict(ref)
            for kind, v in kinds.items():
                hit = k == index[(n, kind)]
                cur = {role: jnp.where(hit, jnp.asarray(v.get(role, ref[role])), c)
                       for role, c in cur.items()}
            out[n] = cur
        return out

    def hook_for(k):
        def observe(node, inputs, outputs):
            if outputs is not None or node.name not in layers:
                return None
            ins = list(inputs)
            first, second = ins[0], ins[1] if len(ins) > 1 else None
            for kind in ("weight", "act"):
                if (node.name, kind) not in index:
                    continue
                q = specs[(node.name, kind)]
                lq, state = q[node.name], layer_state(q, qstate, node.name)
                hit = k == index[(node.name, kind)]
                ins[0] = jnp.where(hit, lq.quantizer.quantize_input(node, lq, first, state),
                                   ins[0])
                if OPS[node.op].quantized_operands and second is not None:
                    ins[1] = jnp.where(hit, lq.quantizer.quantize_operand(
                        node, lq, second, state), ins[1])
            return ins
        return observe

    def one(k):
        yq, _ = execute(graph, params_for(k), x, observe=hook_for(k))
        return jnp.sum(jnp.square(yq - yf))

    return jax.lax.map(one, jnp.arange(len(keys)))


def sensitivity_order(rows: Iterable[LayerSensitivity]) -> list[LayerSensitivity]:
    """``rows`` most sensitive first: ascending :attr:`LayerSensitivity.worst_db` (a stable
    sort, so equal layers keep their order)."""
    return sorted(rows, key=lambda r: r.worst_db)
