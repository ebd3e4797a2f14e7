"""Cross-layer equalization and high-bias absorption (Nagel et al. 2019, section 4.1).

For two consecutive layers ``y = f(W1 x + b1)``, ``z = W2 y + b2`` with ``f`` ReLU or the
identity (positively homogeneous: ``f(x / s) = f(x) / s`` for ``s > 0``), scaling the
intermediate channel ``i`` by ``1 / s_i`` in the first layer and by ``s_i`` in the second keeps
the float function exactly. With ``r1_i`` the range of the first layer's output channel ``i``
and ``r2_i`` the range of the second layer's input channel ``i`` (``max |w|`` over the rest of
the kernel), the paper's optimal scale (section 4.1)

    ``s_i = sqrt(r1_i * r2_i) / r2_i``

makes both ranges ``sqrt(r1_i * r2_i)``: per-tensor weight quantization then wastes no codes on
channels whose weights are small. Pairs are Conv->Conv (dense, or depthwise with channel
multiplier 1 on either side) and Gemm->Gemm whose intermediate tensor feeds nothing else;
chains (conv -> depthwise -> pointwise) are equalized by sweeping over the pairs until the
scales stop changing (the paper's iterative procedure for more than two layers).

High-bias absorption (section 4.1, "absorbing high biases"): equalization can give channels
large biases, hence wide activation ranges. Where ``f`` is ReLU and ``c_i <= `` every
pre-activation value ``h_i``, ``ReLU(h - c) + c = ReLU(h)``, so ``c`` moves into the next layer:
``b1' = b1 - c``, ``b2' = b2 + W2 c``. The paper takes ``c = max(0, beta - 3 gamma)`` from the
BatchNorm shift and scale; npujax's graphs have BatchNorm folded away, so ``beta`` and ``gamma``
are replaced by the per-channel mean and standard deviation of ``h`` on the calibration data,
and ``c`` is capped at the smallest ``h`` observed, so the float function is unchanged on the
calibration data. Absorption into a convolution with padding is skipped: its border outputs read
padded zeros, not ``c``, so the shift would not be exact there.

References:
  Nagel, van Baalen, Blankevoort, Welling 2019, "Data-Free Quantization Through Weight
  Equalization and Bias Correction", arXiv:1906.04721, section 4.1 (equalization, its optimal
  scale and the absorption of high biases). Bias correction (section 4.2) is
  :func:`npujax.quantize.ptq.bias_correction`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from npujax.ir.execute import execute, tap
from npujax.ir.graph import Graph, Node, Params
from npujax.ops import kernel_in_axis, kernel_out_axis, run_op
from npujax.quantize.methods._common import (
    check_batches,
    copy_params,
    is_int,
    is_number,
    require,
)
from npujax.quantize.methods.base import PTQMethod, PTQStep, Stage
from npujax.quantize.spec import QuantSpec

__all__ = ["CrossLayerEqualization", "LayerPair", "equalization_pairs", "equalize_pair"]


class LayerPair(NamedTuple):
    """Two layers that share the intermediate channels (see :func:`equalization_pairs`).

    Attributes:
      first, second: the layer names.
      relu: the activation between them is ReLU (else the identity).
      second_axis: the axis of ``second``'s kernel that runs over the intermediate channels
        (its input channels; a depthwise conv's output channels).
    """

    first: str
    second: str
    relu: bool
    second_axis: int


def _depthwise(node: Node) -> bool:
    k = dict(zip(node.attrs["kernel_layout"], node.attrs["kernel_shape"]))
    return int(node.attrs["groups"]) > 1 and k["I"] == 1 and int(node.attrs["groups"]) == k["O"]


def _channels_ok(node: Node) -> bool:
    """A Gemm, a dense Conv, or a depthwise Conv with channel multiplier 1."""
    if node.op == "Gemm":
        return True
    return node.op == "Conv" and (int(node.attrs["groups"]) == 1 or _depthwise(node))


def _sole_reader(graph: Graph, tensor: str) -> Node | None:
    users = graph.consumers(tensor)
    if len(users) != 1 or tensor in graph.outputs:
        return None
    return users[0]


def equalization_pairs(graph: Graph, params: Params) -> list[LayerPair]:
    """The consecutive layer pairs cross-layer equalization can rescale, in graph order.

    A pair is ``first -> [ReLU] -> second``: both Conv (dense, or depthwise with channel
    multiplier 1) or both Gemm, ``first``'s activation ReLU (fused as its epilogue or a
    separate ``Relu`` node) or none, and the intermediate tensor(s) read by ``second`` alone.

    Args:
      graph: the model (BN folded).
      params: its params (layers need a ``kernel``).

    Returns:
      The pairs (a layer may be the ``second`` of one pair and the ``first`` of the next).
    """
    pairs = []
    for n1 in graph.nodes:
        if n1.op not in ("Conv", "Gemm") or "kernel" not in params.get(n1.name, {}) \
                or not _channels_ok(n1):
            continue
        epi = tuple(n1.attrs.get("epilogue", ()))
        if epi not in ((), ("Relu",)):
            continue
        relu = bool(epi)
        n2 = _sole_reader(graph, n1.outputs[0])
        if n2 is not None and n2.op == "Relu" and not relu:
            relu = True
            n2 = _sole_reader(graph, n2.outputs[0])
        if n2 is None or n2.op != n1.op or not _channels_ok(n2) \
                or "kernel" not in params.get(n2.name, {}):
            continue
        if n1.op == "Conv" and (n1.attrs["data_layout"] != n2.attrs["data_layout"]):
            continue
        axis = kernel_out_axis(n2) if n2.op == "Conv" and _depthwise(n2) else kernel_in_axis(n2)
        pairs.append(LayerPair(n1.name, n2.name, relu, axis))
    return pairs


def _ranges(w: np.ndarray, axis: int) -> np.ndarray:
    return np.max(np.abs(w), axis=tuple(i for i in range(w.ndim) if i != axis % w.ndim))


def _along(v: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def equalize_pair(w1: np.ndarray, b1: np.ndarray | None, w2: np.ndarray, out_axis1: int,
                  axis2: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    """One equalization step of a layer pair (Nagel et al. 2019, section 4.1).

    Args:
      w1: the first kernel (any layout), float32.
      b1: its bias ``[C]`` or None.
      w2: the second kernel.
      out_axis1: ``w1``'s output-channel axis (``C`` entries).
      axis2: ``w2``'s axis over the same ``C`` channels.

    Returns:
      ``(w1 / s, b1 / s, w2 * s, s)`` with ``s_i = sqrt(r1_i r2_i) / r2_i`` (float32; ``s_i =
      1`` where either range is 0).
    """
    r1 = _ranges(w1, out_axis1).astype(np.float64)
    r2 = _ranges(w2, axis2).astype(np.float64)
    ok = (r1 > 0) & (r2 > 0)
    s = np.where(ok, np.sqrt(r1 * r2) / np.where(ok, r2, 1.0), 1.0).astype(np.float32)
    w1n = (w1 / _along(s, w1.ndim, out_axis1)).astype(np.float32)
    b1n = None if b1 is None else (b1 / s).astype(np.float32)
    w2n = (w2 * _along(s, w2.ndim, axis2)).astype(np.float32)
    return w1n, b1n, w2n, s


def _absorbable(graph: Graph, pair: LayerPair, params: Params) -> bool:
    n2 = graph.node(pair.second)
    if not pair.relu or "bias" not in params[pair.first]:
        return False
    return n2.op == "Gemm" or all(tuple(p) == (0, 0) for p in n2.attrs["padding"])


def _kernel_sum(node: Node, w: np.ndarray) -> np.ndarray:
    """``[C_mid, C_out]`` (dense) or ``[C_mid]`` (depthwise): the kernel summed over its
    spatial taps, i.e. the output shift per unit of a constant input channel."""
    if node.op == "Gemm":
        return w
    lay = node.attrs["kernel_layout"]
    spatial = tuple(i for i, d in enumerate(lay) if d not in "OI")
    m = np.sum(w, axis=spatial)
    rest = "".join(d for d in lay if d in "OI")  # the order of O and I that is left
    m = m if rest == "IO" else m.T
    return m[0] if _depthwise(node) else m


@dataclasses.dataclass(frozen=True, kw_only=True)
class CrossLayerEqualization(PTQMethod):
    """Cross-layer equalization with high-bias absorption (Nagel et al. 2019, section 4.1).

    ``pre_calibration``: rewrites the float model's weights and biases, keeping its function
    (exactly for equalization; on the calibration data for absorption, see the module
    docstring), so per-tensor (and low-bit per-channel) weight grids fit every channel.

    Attributes:
      absorb_bias: absorb high biases after equalization (section 4.1).
      num_sigma: ``c = max(0, mean - num_sigma * std)`` of the pre-activation (the paper's 3).
      max_sweeps: at most this many sweeps over all pairs (chains need several).
      tolerance: stop when every scale of a sweep is within ``tolerance`` of 1.

    Raises:
      ConfigError: a field out of range (named).

    Examples:
      >>> step = CrossLayerEqualization().apply(graph, params, quant, [x], None)  # doctest: +SKIP
    """

    name: ClassVar[str] = "cle"
    stage: ClassVar[Stage] = "pre_calibration"

    absorb_bias: bool = True
    num_sigma: float = 3.0
    max_sweeps: int = 20
    tolerance: float = 1e-4

    def __post_init__(self) -> None:
        c = "CrossLayerEqualization"
        require(isinstance(self.absorb_bias, bool), c, "absorb_bias", self.absorb_bias,
                "True or False")
        require(is_number(self.num_sigma) and self.num_sigma >= 0, c, "num_sigma",
                self.num_sigma, "a finite number >= 0 (the paper's 3)")
        require(is_int(self.max_sweeps) and self.max_sweeps >= 1, c, "max_sweeps",
                self.max_sweeps, "an int >= 1")
        require(is_number(self.tolerance) and self.tolerance > 0, c, "tolerance",
                self.tolerance, "a finite number > 0")

    def apply(self, graph: Graph, params: Params, quant: QuantSpec,
              batches: Sequence[ArrayLike], qstate: dict[str, Any] | None) -> PTQStep:
        """Equalize every pair of :func:`equalization_pairs`, then absorb high biases.

        Args:
          graph: the BN-folded float model.
          params: its params.
          quant: passed through unchanged.
          batches: calibration batches (for the absorption's statistics).
          qstate: passed through (None before calibration).

        Returns:
          A :class:`~npujax.quantize.methods.PTQStep` with the new params (the graph gains a
          ``bias`` role on a second layer that had none and receives an absorbed bias) and one
          note per pair: ``"c1->dw: 8 channels, weight range ratio 31.6 -> 1.00"``.

        Raises:
          CalibrationError: empty, NaN or inf batches (when absorbing).
        """
        pairs = equalization_pairs(graph, params)
        p = copy_params(params)
        w = {n: np.asarray(p[n]["kernel"], np.float32) for pr in pairs
             for n in (pr.first, pr.second)}
        b = {n: np.asarray(p[n]["bias"], np.float32) for n in w if "bias" in p[n]}
        before = {pr: self._ratio(graph, pr, w) for pr in pairs}
        for _ in range(self.max_sweeps):
            worst = 0.0
            for pr in pairs:
                n1 = graph.node(pr.first)
                w[pr.first], b1, w[pr.second], s = equalize_pair(
                    w[pr.first], b.get(pr.first), w[pr.second], kernel_out_axis(n1),
                    pr.second_axis)
                if b1 is not None:
                    b[pr.first] = b1
                worst = max(worst, float(np.max(np.abs(np.log(s))))) if s.size else worst
            if worst <= np.log1p(self.tolerance):
                break
        for n in w:
            p[n]["kernel"] = jax.device_put(w[n])
            if n in b:
                p[n]["bias"] = jax.device_put(b[n])
        notes = [f"{pr.first}->{pr.second}: "
                 f"{w[pr.first].shape[kernel_out_axis(graph.node(pr.first))]}"
                 f" channels equalized, weight range ratio {before[pr]:.3g} -> "
                 f"{self._ratio(graph, pr, w):.3g}" for pr in pairs]
        if self.absorb_bias:
            graph, p, more = self._absorb(graph, p, pairs, batches)
            notes += more
        if not pairs:
            notes.append("no Conv->Conv or Gemm->Gemm pair to equalize")
        return PTQStep(graph, p, quant, qstate, tuple(notes))

    @staticmethod
    def _ratio(graph: Graph, pr: LayerPair, w: dict[str, np.ndarray]) -> float:
        """The largest over the smallest channel range of the first kernel (the per-tensor
        grid's waste)."""
        r = _ranges(w[pr.first], kernel_out_axis(graph.node(pr.first)))
        r = r[r > 0]
        return float(r.max() / r.min()) if r.size else 1.0

    def _absorb(self, graph: Graph, p: Params, pairs: list[LayerPair],
                batches: Sequence[ArrayLike]) -> tuple[Graph, Params, list[str]]:
        todo = [pr for pr in pairs if _absorbable(graph, pr, p)]
        notes = [f"{pr.first}->{pr.second}: no bias absorption ("
                 + ("identity activation" if not pr.relu else "no bias" if "bias" not in
                    p[pr.first] else "the second layer pads its input") + ")"
                 for pr in pairs if pr not in todo]
        if not todo:
            return graph, p, notes
        data = check_batches(batches, "cross-layer equalization (bias absorption)")
        firsts = [pr.first for pr in todo]
        plain = {n: graph.node(n).replace(attrs={k: v for k, v in graph.node(n).attrs.items()
                                                 if k != "epilogue"}) for n in firsts}

        def stats(params, x):
            _, taps = execute(graph, params, x, observe=tap(firsts))
            out = {}
            for n in firsts:
                h = run_op(plain[n], [taps[n][0]], params[n])[0]  # the pre-activation
                ax = (plain[n].attrs["data_layout"].index("C") if plain[n].op == "Conv"
                      else h.ndim - 1)
                h = jnp.moveaxis(h, ax, -1).reshape(-1, h.shape[ax])
                out[n] = (jnp.sum(h, 0), jnp.sum(h * h, 0), jnp.min(h, 0),
                          jnp.float32(h.shape[0]))
            return out

        fn = jax.jit(stats)
        acc: dict[str, list[np.ndarray]] = {}
        for x in data:
            for n, v in jax.device_get(fn(p, jnp.asarray(x))).items():
                v = [np.asarray(a, np.float64) for a in v]
                if n not in acc:
                    acc[n] = v
                else:
                    acc[n] = [acc[n][0] + v[0], acc[n][1] + v[1], np.minimum(acc[n][2], v[2]),
                              acc[n][3] + v[3]]
        nodes = {n.name: n for n in graph.nodes}
        for pr in todo:
            s1, s2, lo, cnt = acc[pr.first]
            mean = s1 / cnt
            std = np.sqrt(np.maximum(s2 / cnt - mean * mean, 0.0))
            c = np.maximum(0.0, np.minimum(mean - self.num_sigma * std, lo)).astype(np.float32)
            n2 = graph.node(pr.second)
            m = _kernel_sum(n2, np.asarray(p[pr.second]["kernel"], np.float64))
            shift = (c * m if m.ndim == 1 else c.astype(np.float64) @ m).astype(np.float32)
            p[pr.first]["bias"] = jax.device_put(
                np.asarray(p[pr.first]["bias"], np.float32) - c)
            b2 = np.asarray(p[pr.second]["bias"], np.float32) if "bias" in p[pr.second] \
                else np.zeros(shift.shape, np.float32)
            p[pr.second]["bias"] = jax.device_put(b2 + shift)
            if "bias" not in n2.params:
                nodes[n2.name] = n2.replace(params=(*n2.params, "bias"))
            notes.append(f"{pr.first}->{pr.second}: absorbed biases of {int(np.sum(c > 0))} "
                         f"of {c.size} channels (largest {float(c.max(initial=0.0)):.3g})")
        graph = graph.replace(nodes=tuple(nodes[n.name] for n in graph.nodes))
        return graph, p, notes
