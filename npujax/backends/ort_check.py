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
      feeds: ``{input name: array}`` (the whole batch in one run; the model's batch dimension
        must be dynamic or equal the arrays').
      threads: onnxruntime's intra-op threads (1: deterministic summation order).

    Returns:
      ``{level: [output arrays]}``.

    Raises:
      ConfigError: onnxruntime is not installed (names the package to install).
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
        out[level] = [np.asarray(y) for y in sess.run(None, dict(feeds))]
    return out
