"""Run an exported model in onnxruntime at every graph optimization level.

onnxruntime rewrites a QDQ model differently at each level: ``ORT_DISABLE_ALL`` runs every
QuantizeLinear/DequantizeLinear as written, ``BASIC`` folds constants and fuses QDQ groups into
its integer kernels (QLinearConv, QGemm, ...), ``EXTENDED`` and ``ALL`` add more fusions and
layout changes. A file meant for deployment must give the same outputs at all of them
(onnxruntime's ``GraphOptimizationLevel``, "Graph optimizations" in its documentation).

From ``BASIC`` on, onnxruntime also fuses a blocked int4/int8 weight ``DequantizeLinear`` into
its ``MatMulNBits`` kernel, whose default accuracy level (4) quantizes the *activations* to int8
as well, which a weight-only file (GPTQ's) does not ask for. The check runs it at accuracy level 1
(float activations: the session entry ``session.qdq_matmulnbits_accuracy_level``), the file's own
semantics; a deployment that keeps level 4 trades that accuracy for speed.

End to end those outputs need not equal npujax's fake-quant bit for bit: float summation order
can put one ``x / scale`` exactly on a rounding tie in one runtime and not the other, and on a
deep model the flipped code compounds through the later layers (PP-OCR rec, 51 quantized layers:
docs/results/quantization.md). :func:`qdq_pair_mismatches` checks the file's semantics without
that compounding: teacher-forced, each ``QuantizeLinear -> DequantizeLinear`` pair fed
onnxruntime's own input tensor.

onnxruntime is an optional dependency (the ``test`` extra): it is imported only when called.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from npujax.errors import ConfigError

__all__ = ["ORT_LEVELS", "run_onnxruntime_levels", "QDQPairCheck", "qdq_pair_mismatches"]

#: onnxruntime's graph optimization levels, weakest first.
ORT_LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")


def run_onnxruntime_levels(
    model: bytes, feeds: Mapping[str, np.ndarray], *, threads: int = 1,
) -> dict[str, list[np.ndarray]]:
    """The outputs of ``model`` on ``feeds`` at each of :data:`ORT_LEVELS` (CPU provider).

    Args:
      model: a serialized ``onnx.ModelProto``.
      feeds: ``{input name: array}``, every array with the same number of examples ``n``
        along axis 0. A model with a dynamic batch dimension runs them in one call; a model
        whose inputs declare a fixed batch ``b`` (an export that folds its traced batch, e.g.
        PP-OCR cls imported at batch 1) runs them in ``n / b`` calls, and each output is the
        calls' outputs concatenated along axis 0.
      threads: onnxruntime's intra-op threads (1: deterministic summation order).

    Returns:
      ``{level: [output arrays]}``.

    Raises:
      ConfigError: onnxruntime is not installed (names the package to install), or the
        model's fixed batch does not divide the number of examples.
    """
    return {level: _run(_session(model, level, threads), feeds) for level in ORT_LEVELS}


def _session(model: bytes, level: str, threads: int) -> Any:
    """A CPU onnxruntime session of ``model`` at optimization ``level`` (see the module
    docstring for the MatMulNBits accuracy level)."""
    try:
        import onnxruntime as ort  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigError("checking the exported model needs onnxruntime (a dependency of "
                          "npujax): pip install onnxruntime, or skip the check "
                          "(npujax quantize --no-ort-check).") from None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def _run(sess: Any, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """``sess``'s outputs on ``feeds``, in calls of the model's fixed batch if it has one,
    concatenated along axis 0."""
    step = _fixed_batch(sess, feeds)
    n = len(next(iter(feeds.values()))) if feeds else 0
    if step is None or step == n:
        return [np.asarray(y) for y in sess.run(None, dict(feeds))]
    parts = [sess.run(None, {k: v[i:i + step] for k, v in feeds.items()})
             for i in range(0, n, step)]
    return [np.concatenate([np.asarray(p[j]) for p in parts]) for j in range(len(parts[0]))]


def _fixed_batch(sess, feeds: Mapping[str, np.ndarray]) -> int | None:
    """The batch size the session's fed inputs declare (None: dynamic)."""
    dims = {i.shape[0] for i in sess.get_inputs() if i.name in feeds and i.shape}
    fixed = {d for d in dims if isinstance(d, int) and d > 0}
    if not fixed:
        return None
    step = fixed.pop()
    n = len(next(iter(feeds.values())))
    if fixed or n % step:
        raise ConfigError(f"the model's inputs declare a fixed batch of {sorted(dims)}, which "
                          f"does not divide the {n} examples fed to onnxruntime; feed a "
                          "multiple of it.")
    return step


#: The suffixes of the ``QuantizeLinear`` node names :func:`npujax.to_onnx` writes: a layer's
#: input, a two-activation GEMM's second operand, and a GEMM's output requantized to its
#: consumer's grid (``requantize_outputs``).
_PAIR_KINDS = ("act", "operand", "out")


@dataclasses.dataclass(frozen=True)
class QDQPairCheck:
    """What :func:`qdq_pair_mismatches` found.

    Attributes:
      pairs: one ``(QuantizeLinear node name, values that differ, values compared)`` per
        activation ``QuantizeLinear -> DequantizeLinear`` pair of the file, in the file's node
        order (a topological order: the first entry with differing values is the upstream-most).
      examples: the examples fed.
      first_divergence: with ``reference``: the first pair (file order) whose onnxruntime output
        differs from the reference end to end (not teacher-forced), as ``(QuantizeLinear node
        name, sorted values that differ, values compared, largest difference in steps of its
        grid)``;
        None when none differs or without ``reference``. A rounding tie that flipped first
        there shows as a few values one step apart; an export fault upstream of it (a wrong
        weight layout, bias or operator) as many values, many steps apart.
    """

    pairs: tuple[tuple[str, int, int], ...]
    examples: int
    first_divergence: tuple[str, int, int, float] | None = None

    @property
    def mismatches(self) -> int:
        """Values that differ, over all pairs."""
        return sum(p[1] for p in self.pairs)

    @property
    def values(self) -> int:
        """Values compared, over all pairs."""
        return sum(p[2] for p in self.pairs)

    @property
    def first_mismatch(self) -> str | None:
        """The name of the first pair's ``QuantizeLinear`` with a differing value (None: all
        equal)."""
        return next((name for name, bad, _ in self.pairs if bad), None)


def qdq_pair_mismatches(model: bytes, graph: Any, quant: Mapping[str, Any],
                        qstate: Mapping[str, Any], feeds: Mapping[str, np.ndarray], *,
                        reference: Mapping[str, np.ndarray] | None = None,
                        threads: int = 1) -> QDQPairCheck:
    """Teacher-forced check of every activation ``QuantizeLinear -> DequantizeLinear`` pair of a
    file written by :func:`npujax.to_onnx`: what the pair returns in onnxruntime against
    npujax's :func:`npujax.numerics.fake_quant` on the grid the layer deploys
    (``quantizer.act_grid``/``operand_grid``, as ``execute``'s quantizer applies it), both fed
    the tensor onnxruntime itself feeds that pair.

    Why: end to end, onnxruntime's outputs drift from fake-quant's on deep models, and not by an
    export fault. Float summation order can put ``x / scale`` exactly on a rounding tie in one
    runtime (47.5, rounded half to even to 48) and just below it in the other (47.499985: 47);
    the one flipped code compounds through the later layers (PP-OCR rec, 51 quantized layers:
    docs/results/quantization.md). Teacher-forced, each pair sees the same input in both, so
    the values must be bit-identical (same grid, zero point, rounding half to even,
    saturation), whatever the upstream float rounding did; a wrong scale, zero point, format
    or Clip in the file differs on most values of that pair.

    onnxruntime runs the file with graph optimizations off (``ORT_DISABLE_ALL``: every pair
    runs as written; from ``ORT_ENABLE_BASIC`` on it fuses them into integer kernels whose
    intermediate tensors cannot be read), with each pair's input and output added as graph
    outputs. A pair's input is the tensor before its ``Clip`` when the file has one (formats
    narrower than their storage type), so the Clip is checked too. The pairs of one format run
    as one jitted ``fake_quant`` call over their concatenated values (a per-element grid: the
    same elementwise arithmetic as per tensor).

    Not checked: the weights' ``DequantizeLinear`` and the int32 biases (constants:
    :func:`npujax.backends.onnx_export.exported_biases` reads them), and whether every quantized
    layer has a pair (``to_onnx`` writes one for each).

    Args:
      model: a serialized ``onnx.ModelProto`` written by :func:`npujax.to_onnx` from ``graph``,
        ``quant``, ``qstate`` (its pairs are found by their node names
        ``{layer}/act_quant``, ``{layer}/operand_quant``, ``{producer}/out_quant``; other
        ``QuantizeLinear`` nodes are ignored).
      graph: the :class:`npujax.ir.graph.Graph` it was exported from.
      quant: the quantization spec it was exported with (``{layer: LayerQuant}``).
      qstate: the calibrated state it was exported with.
      feeds: ``{input name: array}``, the examples along axis 0 (a few suffice: PP-OCR rec, one
        48 x 320 line, compares 5.5 M values in about 10 CPU s).
      reference: optionally ``{QuantizeLinear node name: npujax's fake-quantized tensor}`` of
        some pairs on the same ``feeds`` (from :func:`npujax.ir.execute.tap`, the inputs as
        the layers read them), for ``QDQPairCheck.first_divergence``. The file may hold a
        tensor in another layout than npujax (``to_onnx`` writes Conv in NCHW and moves its
        Transposes), so the two are compared as sorted values: on a grid, one code flipped by
        one step changes one sorted value by one step, and a fault changes many (a pure
        permutation of a tensor's values is not seen at that pair, only downstream).
      threads: onnxruntime's intra-op threads.

    Returns:
      A :class:`QDQPairCheck` (``mismatches == 0``: the file's quantizers are fake-quant's).

    Raises:
      ConfigError: onnxruntime is not installed, or a pair names a layer that ``quant``/``qstate``
        do not quantize that way (the file was exported from another spec: pass that one).
    """
    import jax
    import onnx

    from npujax.backends.integer import requant_target
    from npujax.ir.execute import layer_state
    from npujax.numerics import fake_quant

    m = onnx.load_from_string(model)
    made = {o: n for n in m.graph.node for o in n.output}
    dq_of = {n.input[0]: n for n in m.graph.node if n.op_type == "DequantizeLinear"}
    inputs = {i.name for i in m.graph.input}
    names = {n.name for n in graph.nodes}

    def grid(layer: str, kind: str, qname: str) -> tuple[Any, np.ndarray, int]:
        lq, state = quant.get(layer), layer_state(quant, qstate, layer)
        fmt = None if lq is None else lq.act if kind == "act" else (
            lq.weight_candidates[0] if len(lq.weight_candidates) == 1 else None)
        if lq is None or fmt is None or state is None:
            raise ConfigError(f"the file's {qname!r} quantizes layer {layer!r}'s {kind}, which "
                              "the spec and qstate passed do not (or without a calibrated "
                              "grid); pass the ones the file was exported with.")
        if kind == "act":
            s, z = lq.quantizer.act_grid(lq, state)
        else:
            s, z = lq.quantizer.operand_grid(graph.node(layer), lq, state)
        return fmt, np.asarray(s, np.float32).reshape(()), int(np.asarray(z).reshape(()))

    pairs = []  # (Q node name, fmt, scale, zero point, input tensor, DQ output tensor)
    for n in m.graph.node:
        prefix, _, what = n.name.rpartition("/")
        kind = what.removesuffix("_quant")
        if n.op_type != "QuantizeLinear" or kind not in _PAIR_KINDS or n.output[0] not in dq_of:
            continue
        layer = prefix
        if kind == "out":
            target = (requant_target(graph, quant, graph.node(prefix))[0]
                      if prefix in names else None)
            if target is None:
                raise ConfigError(f"the file's {n.name!r} requantizes the output of "
                                  f"{prefix!r}, which the graph passed does not requantize; "
                                  "pass the graph and spec the file was exported from.")
            layer, kind_grid = target, "act"
        else:
            kind_grid = kind
        fmt, s, z = grid(layer, kind_grid, n.name)
        src = n.input[0]
        clip = made.get(src)
        if clip is not None and clip.op_type == "Clip" and clip.name == f"{prefix}/{kind}_clip":
            src = clip.input[0]
        pairs.append((n.name, fmt, s, z, src, dq_of[n.output[0]].output[0]))
    if not pairs:
        return QDQPairCheck((), len(next(iter(feeds.values()))) if feeds else 0)

    have = {o.name for o in m.graph.output}
    extra = dict.fromkeys(t for *_, a, b in pairs for t in (a, b)
                          if t not in inputs and t not in have)
    m.graph.output.extend(onnx.ValueInfoProto(name=t) for t in extra)
    sess = _session(m.SerializeToString(), "ORT_DISABLE_ALL", threads)
    got = dict(zip([o.name for o in sess.get_outputs()], _run(sess, feeds)))
    got.update({k: np.asarray(v) for k, v in feeds.items()})

    groups: dict[Any, list[list[np.ndarray]]] = {}
    order: list[tuple[Any, int]] = []  # (format, index within its group) per pair
    for _, fmt, s, z, t_in, t_dq in pairs:
        xs, ss, zs, want = groups.setdefault(fmt, [[], [], [], []])
        x = np.asarray(got[t_in], np.float32).ravel()
        order.append((fmt, len(xs)))
        xs.append(x)
        ss.append(np.full(x.size, s, np.float32))
        zs.append(np.full(x.size, z, np.int32))
        want.append(np.asarray(got[t_dq]).ravel())
    fq = jax.jit(fake_quant, static_argnames=("fmt", "axis"))
    differ: dict[Any, list[tuple[int, int]]] = {}
    for fmt, (xs, ss, zs, want) in groups.items():
        y = np.asarray(fq(np.concatenate(xs), np.concatenate(ss), np.concatenate(zs), fmt=fmt,
                          axis=0))
        w = np.concatenate(want).astype(y.dtype)
        bad = (y != w) & ~(np.isnan(y) & np.isnan(w))
        cuts = np.cumsum([0] + [len(x) for x in xs])
        differ[fmt] = [(int(bad[a:b].sum()), int(b - a)) for a, b in zip(cuts[:-1], cuts[1:])]
    first = None
    for name, _, s, _, _, t_dq in pairs if reference is not None else ():
        assert reference is not None  # (the loop runs only then)
        if name not in reference:
            continue
        r = np.sort(np.asarray(reference[name], np.float32).ravel())
        o = np.sort(np.asarray(got[t_dq], np.float32).ravel())
        if r.size != o.size:
            raise ConfigError(f"the reference of {name!r} has {r.size} values, its pair's "
                              f"output in onnxruntime {o.size}; pass the tensor as the layer "
                              "reads it, on the same examples.")
        d = np.abs(r - o)
        if np.any(d > 0):
            first = (name, int(np.sum(d > 0)), int(d.size), float(d.max() / s))
            break
    return QDQPairCheck(tuple((p[0], *differ[f][i]) for p, (f, i) in zip(pairs, order)),
                        len(next(iter(feeds.values()))), first)
