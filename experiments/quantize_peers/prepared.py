"""A model of ``compare.py prepare``'s work folder, loaded as ``npujax quantize`` loads it.

Shared by the scripts here that study npujax's calibration on the prepared data
(``defaults.py``, ``bias_correction_guard.py``, ``entropy_diagnosis.py``), with the float
model's outputs on the held-out split (:func:`float_eval`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

#: The static input shapes of the prepared ONNX files whose batch or spatial size is dynamic.
SHAPES = {"ppocr_cls": {"x": [1, 3, 48, 192]}, "ppocr_rec": {"x": [1, 3, 48, 320]}}


def load_prepared(work: Path, model: str, batch: int) -> tuple[Any, Any, Any, list[np.ndarray],
                                                                  Path]:
    """``WORK/MODEL``'s ``float.onnx`` imported, optimized and batch-unfolded (as ``npujax
    quantize`` imports it), its W8A8 spec (``quant_spec(graph, 8, 8)``), ``calib.npy`` in
    batches of ``batch`` and the model's folder: ``(graph, params, quant, batches, folder)``.

    Raises:
      FileNotFoundError: the folder was not prepared (run ``compare.py prepare`` first).
    """
    import npujax as nj
    from npujax.frontends.onnx import from_onnx
    from npujax.ir.passes import optimize, unfold_batch

    d = Path(work) / model
    graph, params = unfold_batch(*optimize(*from_onnx(d / "float.onnx", SHAPES.get(model))))
    xc = np.load(d / "calib.npy")
    return (graph, params, nj.quant_spec(graph, 8, 8),
            [xc[i:i + batch] for i in range(0, len(xc), batch)], d)


def float_eval(folder: Path, graph: Any, params: Any, batch: int) -> tuple[np.ndarray, Any]:
    """The prepared model's held-out inputs (``eval.npz``'s ``x``, float32 ``[N, ...]``) and
    the float model's outputs on them, run in batches of ``batch``: ``(x, y_float)``, the
    reference every study here compares a quantized model with.

    Raises:
      FileNotFoundError: the folder was not prepared (run ``compare.py prepare`` first).
    """
    from npujax.workflows.quantize import _predict

    xe = np.load(Path(folder) / "eval.npz")["x"]
    return xe, _predict(graph, params, xe, batch)
