"""Load a model and its data for a search or a fine-tuning run: a saved npujax model, a Keras
application or an ONNX model, data from a named source, and calibrated activation grids when the
model has none. :func:`load_model` is how every command reads a model that is not ONNX."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from npujax._progress import phase
from npujax.data.sources import load_inputs
from npujax.errors import ConfigError
from npujax.frontends.onnx import from_onnx
from npujax.ir.graph import Graph, Params
from npujax.ir.passes import optimize
from npujax.quantize.calibrate import calibrate
from npujax.quantize.model_file import load_graph
from npujax.quantize.spec import quant_spec

__all__ = ["LoadedModel", "load_model", "load_model_and_data"]

log = logging.getLogger(__name__)


def load_model(
    model: str | os.PathLike[str],
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> tuple[Graph, Params, dict[str, Any], dict[str, Any]]:
    """A saved npujax model or a Keras application (what a command takes besides ONNX).

    Args:
      model: a model file written by ``npujax demo``/:func:`npujax.save_graph`, or a Keras
        application spec ``keras:NAME[:key=value...]`` (:func:`npujax.frontends.keras.
        keras_application`), traced at batch 1 and optimized (BN folded, activations fused).
      input_shapes: must be empty (an ONNX model's option): the shapes of these models are
        fixed, a Keras application's by its spec.

    Returns:
      ``(graph, params, qstate, meta)`` (:func:`npujax.load_graph`'s); for a Keras model no
      states and ``{"source": model}``.

    Raises:
      ConfigError: ``input_shapes`` given; see :func:`npujax.load_graph` and
        :func:`npujax.frontends.keras.trace_keras` for the rest.
    """
    from npujax.frontends.keras import is_keras_spec, trace_keras  # (imports the Flax tracer)

    if is_keras_spec(model):
        if input_shapes:
            raise ConfigError("--input-shape applies to .onnx models; a Keras model's shape is "
                              "part of its spec: keras:NAME:input_shape=224x224x3 (HxWxC).")
        graph, params = optimize(*trace_keras(str(model)))
        return graph, params, {}, {"source": str(model)}
    if input_shapes:
        raise ConfigError("--input-shape applies to .onnx models; a saved npujax model has fixed "
                          "shapes (use --batch to change the batch size where a command has it).")
    return load_graph(model)


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A model with its data split.

    Attributes:
      graph, params: the optimized model.
      qstate: its calibrated states (None when not calibrated here and the file had none).
      meta: the model file's metadata (``{"source": path}`` for an ONNX model).
      x_train, y_train, x_test, y_test: float32 inputs and int32 labels (labels None for an
        unlabelled source).
    """

    graph: Graph
    params: Params
    qstate: dict[str, Any] | None
    meta: dict[str, Any]
    x_train: np.ndarray
    y_train: np.ndarray | None
    x_test: np.ndarray
    y_test: np.ndarray | None


def load_model_and_data(
    model: str | Path,
    *,
    data: str | None = None,
    examples: int = 256,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    calibrate_act_bits: int | None = 8,
    progress: bool = False,
    image_normalization: str | None = None,
) -> LoadedModel:
    """A saved (``.npz``), Keras or ONNX model and its data, calibrated if needed.

    Args:
      model: a model file written by ``npujax demo``/:func:`npujax.save_graph`, a Keras
        application spec ``keras:NAME[:key=value...]`` (:func:`load_model`), or an ``.onnx``
        file.
      data: a source of :func:`npujax.data.sources.load_inputs` (``digits`` for saved models by
        default); required for an ONNX or a Keras model.
      examples: images generated for ``text``/``photos``.
      input_shapes: static shapes of an ONNX model's dynamic inputs.
      seed: split and generation seed.
      calibrate_act_bits: a model without calibration state is calibrated (min-max, W8 and
        this activation width) on up to 128 training examples; None leaves it uncalibrated
        (the caller calibrates with its own spec).
      progress: progress on stderr (``npujax._progress``: bars on a terminal, lines off it).
      image_normalization: how a folder of images is scaled
        (:func:`npujax.data.sources.load_inputs`); None: its default, [-1, 1].

    Returns:
      A :class:`LoadedModel`.

    Raises:
      ConfigError: an ONNX or Keras model without ``data``, or ``input_shapes`` for a saved or
        Keras model.
      GraphError, ShapeError: an unreadable model, or data of the wrong shape.
    """
    qstate: dict[str, Any] | None
    if str(model).lower().endswith(".onnx"):
        if not data:
            raise ConfigError("an ONNX model needs calibration data: pass --data text, --data "
                              "photos (images generated at the model's input size) or --data "
                              "FILE.npy/.npz (your own preprocessed inputs).")
        with phase(f"importing {model}", progress):
            graph, params = optimize(*from_onnx(model, input_shapes or None))
        qstate, meta = None, {"source": str(model)}
    else:
        from npujax.frontends.keras import is_keras_spec

        if is_keras_spec(model) and not data:
            raise ConfigError("a Keras model needs data: pass --data photos or --data text "
                              "(images generated at the model's input size) or --data "
                              "FILE.npy/.npz (your own preprocessed inputs).")
        with phase(f"loading {model}", progress):
            graph, params, qstate, meta = load_model(model, input_shapes)
    source = data or "digits"
    with phase(f"data {source}", progress):
        x, y, xte, yte = load_inputs(source, graph.tensors[graph.inputs[0]].shape, n=examples,
                                     seed=seed, image_normalization=image_normalization)
    log.info("data %s: %d examples to calibrate or train on, %d held out for evaluation (%s)",
             source, len(x), len(xte), "labelled" if y is not None else "unlabelled")
    if not qstate and calibrate_act_bits is not None:
        q = quant_spec(graph, 8, calibrate_act_bits)
        n = min(len(x), 128)
        qstate = calibrate(graph, params, [x[i:i + 32] for i in range(0, n, 32)], q,
                           progress=progress)
        log.info("calibrated activation ranges (min-max) on %d examples of %s", n, source)
    return LoadedModel(graph, params, qstate or None, meta, x, y, xte, yte)
