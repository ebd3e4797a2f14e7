"""Learned quantization steps in the model flow: LSQ (Esser et al. 2020) and LSQ+ (Bhalgat et al.
2020) state for layers with ``LayerQuant.method`` ``"lsq"`` / ``"lsq+"``.

The learned values live in qstate next to the calibrated ones, so :func:`npujax.quantize.execute`,
QAT (:func:`npujax.quantize.train.train_graph`), :func:`npujax.convert` and
:func:`npujax.to_onnx` all read one structure:

=================  ===============  ==========================================================
entry              shape, dtype     meaning
=================  ===============  ==========================================================
``act_scale``      f32[]            activation step ``s`` (learned for LSQ/LSQ+)
``act_zero_point`` i32[]            calibrated integer zero point ``z`` (fixed; LSQ grid is
                                    ``clip(round(x / s) + z, qmin, qmax) - z) * s``)
``act_offset``     f32[]            LSQ+ only: learned offset ``beta``, initialised to
                                    ``-z * s`` (the calibrated grid)
``weight_step``    f32[C_out] / []  weight step per output channel (per tensor when
                                    ``weight_per_channel=False``), zero point 0
=================  ===============  ==========================================================

Initialisation (:func:`init_lsq_state`, called by :func:`npujax.quantize.calibrate`): the
activation step is the calibrated scale (whatever observer chose it); the weight step is the
symmetric per-channel min-max scale ``max|w| / Q_p`` by default (``weight_init="minmax"``), so
LSQ fine-tuning starts exactly from the PTQ grid and the STE/LSQ comparison starts from the same
model; ``weight_init="lsq"`` uses the paper's ``2 * mean|w| / sqrt(Q_p)`` instead (Esser et al.
2020, section 2.1), which clips the largest weights from the start.

Deployment (:func:`deploy_qstate`): scale = the learned step (clamped to ``MIN_SCALE`` as
:func:`npujax.quant.lsq_fake_quant` does), weight zero point 0, so an LSQ-trained model deploys
on exactly the grid it trained on. LSQ+'s real-valued offset is deployed as the integer zero
point ``clip(round(-beta / s), qmin, qmax)``: the only place where the deployed grid can differ
from the trained one (a shift of at most half a step).

References:
  Esser et al. 2020, "Learned Step Size Quantization", arXiv:1902.08153.
  Bhalgat et al. 2020, "LSQ+: Improving low-bit quantization through learnable offsets and
  better initialization", arXiv:2004.09576.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from npujax.errors import ConfigError
from npujax.ir.graph import Graph, Params
from npujax.ops import gemm_nodes, kernel_out_axis
from npujax.quant import MIN_SCALE, lsq_init_step, weight_qparams
from npujax.quantize.execute import QuantSpec

__all__ = ["LEARNED_KEYS", "init_lsq_state", "split_learned", "merge_learned", "deploy_qstate",
           "clamp_steps"]

#: qstate entries that QAT learns for LSQ/LSQ+ layers.
LEARNED_KEYS = ("act_scale", "act_offset", "weight_step")
_STEP_KEYS = ("act_scale", "weight_step")

QState = Mapping[str, Mapping[str, jax.Array]]


def init_lsq_state(graph: Graph, params: Params, quant: QuantSpec, qstate: QState, *,
                   weight_init: str = "minmax") -> dict[str, dict[str, jax.Array]]:
    """Add the LSQ/LSQ+ entries (``weight_step``, ``act_offset``) to a calibrated qstate.

    Args:
      graph, params: the (BN-folded) model whose kernels initialise the weight steps.
      quant: the spec; only layers with ``method`` ``"lsq"``/``"lsq+"`` get entries.
      qstate: calibrated ``{layer: {"act_scale", "act_zero_point"}}``.
      weight_init: ``"minmax"`` (``max|w| / Q_p`` per channel, the PTQ grid) or ``"lsq"``
        (``2 * mean|w| / sqrt(Q_p)``, Esser et al. 2020).

    Returns:
      A new qstate (the input is not modified); entries as in the module table.

    Raises:
      ConfigError: unknown ``weight_init``.
    """
    if weight_init not in ("minmax", "lsq"):
        raise ConfigError(f"weight_init must be 'minmax' or 'lsq', got {weight_init!r}.")
    out = {k: dict(v) for k, v in qstate.items()}
    for node in gemm_nodes(graph):
        lq = quant.get(node.name)
        if lq is None or lq.method == "ste":
            continue
        entry = out.setdefault(node.name, {})
        if lq.weight is not None:
            (fmt,) = lq.weight_candidates
            w = jnp.asarray(params[node.name]["kernel"], jnp.float32)
            axis = kernel_out_axis(node) if lq.weight_per_channel else None
            step = (weight_qparams(w, fmt, axis)[0] if weight_init == "minmax"
                    else lsq_init_step(w, fmt, axis))
            entry["weight_step"] = jnp.asarray(step, jnp.float32)
        if lq.method == "lsq+" and lq.act is not None and "act_scale" in entry:
            s = jnp.asarray(entry["act_scale"], jnp.float32)
            entry["act_offset"] = -jnp.asarray(entry["act_zero_point"]).astype(jnp.float32) * s
    return out


def split_learned(quant: QuantSpec, qstate: QState | None) -> tuple[dict, dict]:
    """``(learned, fixed)``: the LSQ entries QAT optimises, and everything else."""
    learned: dict[str, dict[str, jax.Array]] = {}
    fixed: dict[str, dict[str, jax.Array]] = {}
    for name, entry in (qstate or {}).items():
        lq = quant.get(name)
        lsq = lq is not None and lq.method != "ste"
        for k, v in entry.items():
            (learned if lsq and k in LEARNED_KEYS else fixed).setdefault(name, {})[k] = v
    return learned, fixed


def merge_learned(learned: QState, fixed: QState) -> dict[str, dict[str, jax.Array]]:
    """Inverse of :func:`split_learned`."""
    out = {k: dict(v) for k, v in fixed.items()}
    for name, entry in learned.items():
        out.setdefault(name, {}).update(entry)
    return out


def clamp_steps(learned: QState) -> dict[str, dict[str, jax.Array]]:
    """Project learned steps onto ``>= MIN_SCALE`` (after an optimizer update)."""
    return {n: {k: jnp.maximum(v, MIN_SCALE) if k in _STEP_KEYS else v for k, v in e.items()}
            for n, e in learned.items()}


def deploy_qstate(quant: QuantSpec | None, qstate: QState | None) -> QState | None:
    """The qstate a converter uses: learned steps clamped to ``MIN_SCALE``, and for LSQ+ the
    integer zero point ``clip(round(-act_offset / act_scale), qmin, qmax)``. STE layers and
    qstates without LSQ entries are returned unchanged."""
    if not quant or not qstate:
        return qstate
    out = {k: dict(v) for k, v in qstate.items()}
    for name, entry in out.items():
        lq = quant.get(name)
        if lq is None or lq.method == "ste":
            continue
        if "act_scale" in entry:
            entry["act_scale"] = jnp.maximum(jnp.asarray(entry["act_scale"], jnp.float32),
                                             MIN_SCALE)
        if lq.method == "lsq+" and "act_offset" in entry and lq.act is not None:
            z = jnp.round(-jnp.asarray(entry["act_offset"], jnp.float32) / entry["act_scale"])
            entry["act_zero_point"] = jnp.clip(z, lq.act.qmin, lq.act.qmax).astype(jnp.int32)
    return out
