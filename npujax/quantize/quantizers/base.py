"""The quantizer interface: how one layer's kernel and input activation are fake-quantized.

A :class:`Quantizer` is configuration (a frozen dataclass, usually without fields); what it
learns or calibrates per layer is its *state*, a NamedTuple pytree of its own type
(``state_type``) held in ``qstate[layer]``. Every consumer of a quantized model asks the layer's
quantizer, never the kind of quantizer:

================================  ==============================================================
method                            used by
================================  ==============================================================
``init_state``                    :func:`npujax.calibrate` (from the observed activation range)
                                  and :func:`init_states` (from another quantizer's calibrated
                                  grid)
``quantize_input``                :func:`npujax.execute` (fake-quant of the input activation)
``quantize_kernel``               :func:`npujax.execute`, bias correction (fake-quant of the
                                  kernel)
``act_grid``, ``weight_grid``     the deployed integer grid: :func:`npujax.convert`,
                                  :func:`npujax.to_onnx`
``init_operand``,                 the second activation operand of a MatMul/Einsum (attention):
``quantize_operand``,             its calibrated grid (:func:`npujax.calibrate`), its fake-quant
``operand_grid``                  (:func:`npujax.execute`), its deployed grid
``learned_fields``, ``project``   QAT (:func:`npujax.train_graph`): which state leaves the
                                  optimizer trains, and their projection after each update
================================  ==============================================================

Implementations: :class:`~npujax.quantize.quantizers.ste.STE` (calibrated activation grid,
min-max weight grid, straight-through gradients), :class:`~npujax.quantize.quantizers.lsq.LSQ`
and :class:`~npujax.quantize.quantizers.lsq.LSQPlus` (learned steps and offsets) and
:class:`~npujax.quantize.quantizers.mixture.Mixture` (a differentiable mixture over candidate
widths, for the precision search). Each registers itself in :data:`QUANTIZERS` by name, so a
new quantizer is one new module in this package.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from npujax.errors import ConfigError
from npujax.numerics import Format, IntFormat, fake_quant, qparams_from_range, weight_qparams
from npujax.ops import kernel_in_axis, kernel_out_axis, out_channel_view

if TYPE_CHECKING:
    from npujax.ir.graph import Graph, Node, Params
    from npujax.quantize.spec import LayerQuant, QuantSpec

__all__ = ["Quantizer", "WeightGrid", "QUANTIZERS", "register_quantizer", "get_quantizer",
           "quantize_weight", "init_states", "split_learned", "merge_learned", "QState",
           "calibrated_grid", "missing_grid", "missing_operand_grid", "operand_qparams"]

#: ``{layer: state}``: each quantized layer's state (its quantizer's ``state_type``).
QState = Mapping[str, Any]


class WeightGrid(NamedTuple):
    """The integer grid a layer's weights deploy on.

    Attributes:
      scale: float32 scale(s): scalar, ``[C_out]`` (per channel) or the per-block shape.
      zero_point: int32 zero point(s), same shape.
      axis: the per-channel or blocked axis of the kernel (None: per tensor).
      block_size: block length along ``axis`` (None: not per block).
    """

    scale: jax.Array
    zero_point: jax.Array
    axis: int | None
    block_size: int | None


def quantize_weight(w: jax.Array, fmt: Format, axis: int | None, key: jax.Array | None = None,
                    *, block_size: int | None = None, name: str | None = None) -> jax.Array:
    """Fake-quantize a weight tensor with a symmetric min-max scale (per channel on ``axis``, or
    per block of ``block_size`` along ``axis``); ``key`` selects stochastic rounding.

    Args:
      w: float32 kernel of any shape.
      fmt: weight format (integer or FP8).
      axis: output-channel axis for per-channel scales (or the blocked axis); None per tensor.
      key: PRNG key for stochastic rounding, or None (round half to even).
      block_size: per-block scales over this many elements along ``axis``.
      name: the weight's name, for error messages.

    Returns:
      ``w`` on its grid (float32, same shape); straight-through gradient.

    Raises:
      QuantizationError: a concrete ``w`` holding NaN or inf (names the weight and channel).
    """
    scale, zero_point = weight_qparams(w, fmt, axis, block_size=block_size, name=name)
    return fake_quant(w, scale, zero_point, fmt, axis, block_size=block_size, key=key,
                      name=name)


def calibrated_grid(lq: LayerQuant, act_range: tuple[jax.Array, jax.Array] | None,
                    act_grid: tuple[jax.Array, jax.Array] | None
                    ) -> tuple[jax.Array | None, jax.Array | None]:
    """``(scale, zero_point)`` of a layer's input for :meth:`Quantizer.init_state`: the given
    grid, or the one of the observed range (:func:`npujax.numerics.qparams_from_range`); ``(None,
    None)`` for a float input or when neither is given."""
    if lq.act is None:
        return None, None
    if act_grid is not None:
        return act_grid
    if act_range is None:
        return None, None
    return qparams_from_range(act_range[0], act_range[1], lq.act, lq.act_symmetric)


def missing_grid(node: Node) -> ConfigError:
    """The error a quantizer raises for a layer that quantizes its input without a calibrated
    grid in its state."""
    return ConfigError(
        f"layer {node.name!r} quantizes its input activation but qstate has no calibrated "
        "grid for it; run calibration first (npujax.calibrate) and pass its result as qstate.")


def missing_operand_grid(node: Node) -> ConfigError:
    """The error for a GEMM of two activations whose state has no calibrated second-operand
    grid."""
    return ConfigError(
        f"layer {node.name!r} ({node.op} of two activations) quantizes its second operand but "
        "qstate has no calibrated grid for it; run npujax.calibrate with this quant spec and "
        "pass its result as qstate.")


def operand_qparams(lq: LayerQuant, fmt: Format, operand_range: tuple[ArrayLike, ArrayLike]
                    ) -> tuple[jax.Array, jax.Array]:
    """``(scale, zero_point)`` of a second activation operand in ``fmt`` over its observed
    range: symmetric for signed integer and FP8 formats (zero point 0, as weights), asymmetric
    for unsigned ones."""
    symmetric = not isinstance(fmt, IntFormat) or fmt.signed
    lo, hi = (jnp.asarray(v, jnp.float32) for v in operand_range)
    return qparams_from_range(lo, hi, fmt, symmetric)


class Quantizer(abc.ABC):
    """How a layer is fake-quantized and deployed (see the module docstring).

    Subclasses are frozen dataclasses; ``name`` is the registered name (``"ste"``, ``"lsq"``,
    ...), ``state_type`` the NamedTuple of the per-layer state, ``learned_fields`` the state
    fields QAT optimises. Every quantizer has a ``state_type`` of its own, even when its fields
    are another's: the model file names a state's quantizer by its type.
    """

    name: ClassVar[str]
    state_type: ClassVar[type]
    learned_fields: ClassVar[tuple[str, ...]] = ()
    #: whether it quantizes the second operand of a GEMM of two activations (``init_operand``)
    quantizes_operands: ClassVar[bool] = False

    def validate(self, lq: LayerQuant) -> None:
        """Raise :class:`~npujax.errors.ConfigError` if ``lq`` cannot use this quantizer."""
        if len(lq.weight_candidates) > 1 or lq.act_candidates:
            raise ConfigError(f"quantizer {self.name!r} quantizes with one format per operand; "
                              "several candidate formats make a search mixture (quantizer "
                              "'mixture').")

    @abc.abstractmethod
    def init_state(self, node: Node, lq: LayerQuant, kernel: jax.Array | None, *,
                   act_range: tuple[jax.Array, jax.Array] | None = None,
                   act_grid: tuple[jax.Array, jax.Array] | None = None) -> Any:
        """The layer's initial state.

        Args:
          node: the layer.
          lq: its quantization.
          kernel: its float32 kernel (None for a layer without weights).
          act_range: the observed ``(min, max)`` of its input (calibration), or None.
          act_grid: an already calibrated ``(scale, zero_point)`` of its input, or None.
        """

    @abc.abstractmethod
    def quantize_input(self, node: Node, lq: LayerQuant, x: jax.Array, state: Any,
                       key: jax.Array | None = None) -> jax.Array:
        """The fake-quantized input activation ``x`` (differentiable)."""

    @abc.abstractmethod
    def quantize_kernel(self, node: Node, lq: LayerQuant, w: jax.Array, state: Any,
                        key: jax.Array | None = None) -> jax.Array:
        """The fake-quantized kernel ``w`` (differentiable)."""

    def act_grid(self, lq: LayerQuant, state: Any) -> tuple[jax.Array, jax.Array]:
        """The deployed input grid ``(scale f32[], zero_point i32[])``.

        Raises:
          ConfigError: the state has no calibrated activation grid.
        """
        if state is None or getattr(state, "act_scale", None) is None:
            raise ConfigError("the layer quantizes its input but its state has no calibrated "
                              "activation grid; run npujax.calibrate with this quant spec.")
        return state.act_scale, state.act_zero_point

    def weight_grid(self, node: Node, lq: LayerQuant, w: ArrayLike, state: Any, *,
                    out_axis: int | None = None, in_axis: int | None = None) -> WeightGrid:
        """The deployed weight grid: symmetric min-max per block (``weight_block_size``), per
        output channel or per tensor. ``out_axis``/``in_axis`` default to the node's kernel
        layout (pass them for a transposed kernel view)."""
        (fmt,) = lq.weight_candidates
        out_axis = kernel_out_axis(node) if out_axis is None else out_axis
        in_axis = kernel_in_axis(node) if in_axis is None else in_axis
        name = f"{node.name}/kernel"
        if lq.weight_block_size is not None:
            s, z = weight_qparams(w, fmt, in_axis, block_size=lq.weight_block_size, name=name)
            return WeightGrid(s, z, in_axis, lq.weight_block_size)
        axis = out_axis if lq.weight_per_channel else None
        s, z = weight_qparams(w, fmt, axis, name=name)
        return WeightGrid(s, z, axis, None)

    def init_operand(self, node: Node, lq: LayerQuant, state: Any,
                     operand_range: tuple[ArrayLike, ArrayLike]) -> Any:
        """``state`` with the calibrated grid of the second activation operand of a GEMM of
        two activations (MatMul, Einsum), from its observed ``(min, max)``.

        Raises:
          ConfigError: this quantizer does not quantize a second activation operand.
        """
        raise ConfigError(
            f"layer {node.name!r} ({node.op} of two activations) quantizes its second operand, "
            f"which quantizer {self.name!r} does not support; use quantizer 'ste' (or the "
            "search 'mixture') for these layers, e.g. a QuantRule for them first.")

    def quantize_operand(self, node: Node, lq: LayerQuant, x: jax.Array, state: Any,
                         key: jax.Array | None = None) -> jax.Array:
        """The fake-quantized second activation operand ``x`` of a GEMM of two activations
        (differentiable; straight-through inside the grid's range).

        Raises:
          ConfigError: no calibrated operand grid in ``state``, or a quantizer without one.
        """
        if not lq.weight_candidates:
            return x
        grid = getattr(state, "operand_scale", None)
        if grid is None:
            raise missing_operand_grid(node)
        (fmt,) = lq.weight_candidates
        return fake_quant(x, state.operand_scale, state.operand_zero_point, fmt, key=key)

    def operand_grid(self, node: Node, lq: LayerQuant, state: Any
                     ) -> tuple[jax.Array, jax.Array]:
        """The deployed grid ``(scale f32[], zero_point i32[])`` of the second activation
        operand of a GEMM of two activations.

        Raises:
          ConfigError: the state has no calibrated operand grid.
        """
        if getattr(state, "operand_scale", None) is None:
            raise missing_operand_grid(node)
        return state.operand_scale, state.operand_zero_point

    def project(self, learned: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """Project learned state fields back onto their valid set after an optimizer update."""
        return dict(learned)

    def coerce(self, state: Any, layer: str) -> Any:
        """``state`` as this quantizer's ``state_type`` (a mapping of its fields is converted).

        Raises:
          ConfigError: a state of another quantizer, or unknown fields.
        """
        if isinstance(state, self.state_type):
            return state
        if isinstance(state, Mapping):
            fields = self.state_type._fields  # type: ignore[attr-defined]
            unknown = sorted(set(state) - set(fields))
            if unknown:
                raise ConfigError(f"layer {layer!r}: state fields {unknown} do not belong to "
                                  f"quantizer {self.name!r} (fields {list(fields)}).")
            return self.state_type(**state)
        raise ConfigError(
            f"layer {layer!r} uses quantizer {self.name!r} but its state is a "
            f"{type(state).__name__}; calibrate with this quant spec (npujax.calibrate) or "
            "convert the state with npujax.quantize.init_states.")

    # -- helpers for implementations
    def _calibrated_input(self, node: Node, lq: LayerQuant, x: jax.Array, state: Any,
                          key: jax.Array | None) -> jax.Array:
        """Fake-quant of the input on the state's calibrated grid (``act_scale``,
        ``act_zero_point``); ``x`` itself for a layer that does not quantize its input.

        Raises:
          ConfigError: the layer quantizes its input but the state has no calibrated grid.
        """
        if lq.act is None:
            return x
        if state is None or state.act_scale is None:
            raise missing_grid(node)
        return fake_quant(x, state.act_scale, state.act_zero_point, lq.act, key=key)

    def _with_operand_grid(self, lq: LayerQuant, state: Any,
                           operand_range: tuple[ArrayLike, ArrayLike]) -> Any:
        """``state`` (a new ``state_type`` when None) with the second operand's calibrated
        grid (``operand_scale``, ``operand_zero_point``) from its observed range."""
        if not lq.weight_candidates:
            return state
        (fmt,) = lq.weight_candidates
        s, z = operand_qparams(lq, fmt, operand_range)
        return (state or self.state_type())._replace(operand_scale=s, operand_zero_point=z)

    def _kernel(self, node: Node, lq: LayerQuant, w: jax.Array, key: jax.Array | None
                ) -> jax.Array:
        """Min-max fake-quant of a single-format kernel (per block, channel or tensor)."""
        (fmt,) = lq.weight_candidates
        name = f"{node.name}/kernel"
        if lq.weight_block_size is not None:
            return quantize_weight(w, fmt, kernel_in_axis(node), key,
                                   block_size=lq.weight_block_size, name=name)
        if not lq.weight_per_channel:
            return quantize_weight(w, fmt, None, key, name=name)
        view, axis, back = out_channel_view(node, w)  # a grouped ConvTranspose: a view
        return back(quantize_weight(view, fmt, axis, key, name=name))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


#: Registered quantizers by name.
QUANTIZERS: dict[str, Quantizer] = {}


def register_quantizer(q: Quantizer) -> Quantizer:
    """Register a quantizer instance under its ``name`` (names are unique)."""
    if q.name in QUANTIZERS:
        raise ValueError(f"quantizer {q.name!r} is registered twice.")
    QUANTIZERS[q.name] = q
    return q


def get_quantizer(q: Quantizer | str) -> Quantizer:
    """A quantizer from an instance or a registered name.

    Raises:
      ConfigError: an unknown name (lists the registered ones).
    """
    if isinstance(q, Quantizer):
        return q
    if isinstance(q, str) and q in QUANTIZERS:
        return QUANTIZERS[q]
    raise ConfigError(f"unknown quantizer {q!r}; use one of {sorted(QUANTIZERS)} or a "
                      "npujax.quantize.Quantizer instance.")


def init_states(graph: Graph, params: Params, quant: QuantSpec, qstate: QState
                ) -> dict[str, Any]:
    """Re-initialise calibrated states for the quantizers of ``quant``.

    A layer whose state already has its quantizer's type keeps it; any other state (e.g. STE
    states from a PTQ run, before QAT with LSQ) gives its calibrated activation grid to the new
    quantizer's :meth:`~Quantizer.init_state` (LSQ then starts from the PTQ grid).

    Args:
      graph: the model.
      params: its params (kernels initialise weight steps).
      quant: the spec whose quantizers the states are for.
      qstate: calibrated states (any quantizer with ``act_scale``/``act_zero_point``).

    Returns:
      A new qstate (the input is not modified).
    """
    out: dict[str, Any] = dict(qstate)
    for name, lq in quant.items():
        old = qstate.get(name)
        q = lq.quantizer
        if isinstance(old, q.state_type):
            continue
        grid = None
        if old is not None and getattr(old, "act_scale", None) is not None:
            grid = (old.act_scale, old.act_zero_point)
        node = graph.node(name)
        kernel = params.get(name, {}).get("kernel")
        out[name] = q.init_state(node, lq, None if kernel is None else jnp.asarray(
            kernel, jnp.float32), act_grid=grid)
    return out


def split_learned(quant: QuantSpec, qstate: QState | None
                  ) -> tuple[dict[str, dict[str, jax.Array]], dict[str, Any]]:
    """``(learned, qstate)``: the state leaves QAT optimises (``{layer: {field: array}}``, per
    each quantizer's ``learned_fields``) and the full qstate they are merged back into."""
    learned: dict[str, dict[str, jax.Array]] = {}
    for name, state in (qstate or {}).items():
        lq = quant.get(name)
        if lq is None:
            continue
        fields = {f: getattr(state, f) for f in lq.quantizer.learned_fields
                  if getattr(state, f, None) is not None}
        if fields:
            learned[name] = fields
    return learned, dict(qstate or {})


def merge_learned(learned: Mapping[str, Mapping[str, jax.Array]], qstate: QState
                  ) -> dict[str, Any]:
    """``qstate`` with the learned fields replaced (inverse of :func:`split_learned`)."""
    out = dict(qstate)
    for name, fields in learned.items():
        out[name] = out[name]._replace(**fields)
    return out
