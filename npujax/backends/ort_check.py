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

onnxruntime is an optional dependency (the ``test`` extra): it is imported only when called.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from npujax.errors import ConfigError

__all__ = ["ORT_LEVELS", "run_onnxruntime_levels"]

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
    try:
        import onnxruntime as ort  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigError("checking the exported model needs onnxruntime: pip install "
                          "onnxruntime (or skip the check).") from None
    out = {}
    for level in ORT_LEVELS:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
        sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        step = _fixed_batch(sess, feeds)
        n = len(next(iter(feeds.values()))) if feeds else 0
        if step is None or step == n:
            out[level] = [np.asarray(y) for y in sess.run(None, dict(feeds))]
            continue
        parts = [sess.run(None, {k: v[i:i + step] for k, v in feeds.items()})
                 for i in range(0, n, step)]
        out[level] = [np.concatenate([np.asarray(p[j]) for p in parts])
                      for j in range(len(parts[0]))]
    return out


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
