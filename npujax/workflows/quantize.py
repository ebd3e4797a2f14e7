"""From a float model to a deployable quantized file: the ``npujax quantize`` pipeline.

:func:`quantize_model` runs, on a model and its data:

1. the selected ``pre_calibration`` PTQ methods (:mod:`npujax.quantize.methods`), in order;
2. calibration of the activation ranges with an observer of :data:`npujax.calib.OBSERVERS`;
3. the selected ``post_calibration`` methods, in order;
4. empirical bias correction (Nagel et al. 2019, arXiv:1906.04721, section 4.2), unless off;
5. with labels and ``max_drop``: the accuracy-bounded loop
   (:func:`npujax.quantize.accuracy_control.accuracy_control`), which repeats 2-4 per step;
6. the per-layer report: each layer's output SQNR with the whole model quantized
   (:func:`npujax.quantize.ptq.layer_sqnr`) and its weight-only / activation-only sensitivity
   (:func:`npujax.quantize.sensitivity.sensitivity_split`); the modelled latency on an NPU
   preset (:func:`npujax.lower`);
7. the QDQ ONNX export (:func:`npujax.backends.onnx_export.to_onnx`: int32 biases, dynamic
   batch, value_info, ``onnx.checker`` with ``full_check``), run in onnxruntime at every graph
   optimization level and compared with npujax's fake-quant outputs (:data:`ORT_TOLERANCE`);
   beyond that bound, accepted only if every Q/DQ pair equals fake-quant teacher-forced
   (:data:`TEACHER_FORCED_EXAMPLES`), with the drift recorded.

:func:`write_quantize_outputs` writes the files (all of them or none).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from npujax._atomic import atomic_write_bytes, staged_dir
from npujax._progress import note, phase
from npujax.calib import OBSERVERS
from npujax.errors import ConfigError, QuantizationError, ShapeError
from npujax.ir.execute import execute
from npujax.ir.graph import Graph, Params
from npujax.ir.passes import unfold_batch
from npujax.quantize.accuracy_control import AccuracyControl, accuracy_control
from npujax.quantize.calibrate import calibrate
from npujax.quantize.methods import PTQMethod
from npujax.quantize.ptq import (
    BIAS_CORRECTION_MODES,
    bias_correction,
    deployed_biases,
    guarded_bias_correction,
)
from npujax.quantize.sensitivity import LayerSensitivity, sensitivity_split
from npujax.quantize.spec import LayerQuant, QuantSpec
from npujax.report.quantize import describe_vs_float, layers_csv_text, quantize_markdown

__all__ = ["QuantizeConfig", "QuantizeResult", "quantize_model", "write_quantize_outputs",
           "QUANTIZE_FILES", "ORT_TOLERANCE", "ORT_OUTLIERS", "TEACHER_FORCED_EXAMPLES",
           "TIE_FLIPS", "FAR_SQNR_DB", "FAR_AGREEMENT", "MIN_JUDGED_EXAMPLES", "ort_outliers",
           "output_vs_float"]

log = logging.getLogger(__name__)

#: The files :func:`write_quantize_outputs` writes.
QUANTIZE_FILES = ("model.qdq.onnx", "layers.csv", "report.md", "quantize.json")

#: Default tolerance of the onnxruntime check, relative to the largest float output magnitude:
#: ``max |y_ort - y_npujax| <= ORT_TOLERANCE * max |y_float|`` over the checked examples, at
#: every level, where ``y_npujax`` is npujax's fake-quant :func:`npujax.ir.execute.execute` with
#: the file's int32 biases (:func:`npujax.quantize.ptq.deployed_biases`, which every step of
#: :func:`quantize_model` applies; a float bias adds up to half a bias step more or less). What
#: remains is float summation order, which can flip an activation code at a rounding tie.
#: Measured on the digits CNN, 360 held-out examples, all four levels: W8A8 0.014 on logits up
#: to 25.3 (one example; the 99th percentile 6e-6), W4A4 and W3A3 below 1e-5. The bound catches
#: export faults (a wrong layout, scale or zero point moves outputs by their own magnitude).
#: Such a flip moves one example, an export fault every example: so at most
#: :data:`ORT_OUTLIERS` of the examples (at least one) may exceed the bound. PP-OCR cls W8A8,
#: 200 held-out lines: one line off by 0.036 on a softmax probability, traced node by node to
#: one input code of ``Conv@26`` at a tie: its input, equal to 2e-7 relative through 26 layers,
#: is 3e-7 larger in onnxruntime, where float32 ``x / s`` is exactly 47.5 (code 48, half to
#: even) against 47.499985 in XLA (47); 26 later layers amplify that one code.
ORT_TOLERANCE = 0.02
#: The fraction of checked examples (at least one) allowed beyond :data:`ORT_TOLERANCE`.
ORT_OUTLIERS = 0.01
#: Beyond that, on a deep model such flips compound (PP-OCR rec W8A8, 51 quantized layers: the
#: command refused its own, correct file; docs/results/quantization.md), so the check then
#: runs :func:`npujax.backends.ort_check.qdq_pair_mismatches` on this many examples (those
#: that drifted most): the file
#: is accepted, and the drift recorded (``QuantizeResult.ort_drift``), only if every activation
#: Q/DQ pair equals fake-quant bit for bit teacher-forced (one rec line: 5.5 M values, 0
#: differ; an export fault in a quantizer differs on most values of its pair) and the drift
#: starts as a tie (:data:`TIE_FLIPS`; a fault elsewhere moves most values of the next pair).
TEACHER_FORCED_EXAMPLES = 2
#: The largest fraction of a pair's values (at least one) that may differ, by one grid step, at
#: the first pair where the drift shows: rounding ties flip single codes.
TIE_FLIPS = 1e-3


def ort_outliers(y: np.ndarray, want: np.ndarray, bound: float) -> tuple[int, int, float]:
    """How many examples of ``y`` differ from ``want`` by more than ``bound`` anywhere.

    Args:
      y: ``[n, ...]`` onnxruntime's outputs.
      want: ``[n, ...]`` npujax's outputs, the same shape.
      bound: the largest allowed absolute difference of an output element.

    Returns:
      ``(examples beyond the bound, examples allowed beyond it, largest difference)``; the
      allowance is ``max(1, floor(ORT_OUTLIERS * n))``.
    """
    d = np.abs(np.asarray(y, np.float64) - np.asarray(want, np.float64)).reshape(len(want), -1)
    per_example = d.max(axis=1) if d.size else np.zeros(len(want))
    allowed = max(1, int(ORT_OUTLIERS * len(want)))
    worst = float(per_example.max()) if len(per_example) else 0.0
    return int(np.sum(~(per_example <= bound))), allowed, worst


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantizeConfig:
    """Settings of :func:`quantize_model`.

    Attributes:
      observer: calibration observer, a name of :data:`npujax.calib.OBSERVERS`.
      methods: PTQ method instances (:class:`npujax.quantize.methods.PTQMethod`), each stage's
        run in the order given.
      bias_correction: empirical bias correction after calibration (and the methods).
      bias_correction_mode: what it removes, one of
        :data:`npujax.quantize.ptq.BIAS_CORRECTION_MODES` (:func:`~npujax.quantize.ptq.
        bias_correction`). Default ``"model"``: each layer's mean output shift in the quantized
        model, layer after layer, chosen on held-out validation data that is neither
        calibration nor evaluation data (``experiments/quantize_peers/defaults.py``): on
        2000 rendered PP-OCR cls lines it nearly halves the mean KL divergence from the float
        model (0.0038 -> 0.0021; none 0.0046) and scores as float does (98.45 %;
        ``"weights"`` 98.40, none 98.20), on 3744 MNIST images its KL is the lowest too
        (0.15e-3, ``"weights"`` 0.18e-3); it costs one quantized forward pass of the
        calibration data per wave of layers (a whole ``npujax quantize`` of PP-OCR cls: 83
        CPU s against 47 with ``"weights"``; PP-OCR rec's calibration and correction, 47
        waves at 48 x 320: 1604 CPU s against 64).
      bias_correction_guard: keep the correction only where it does not lower the quantized
        model's output SQNR against float on the calibration data
        (:func:`~npujax.quantize.ptq.guarded_bias_correction`); the result says which was kept.
      calib_examples: calibration examples (from the training split), in batches of
        ``batch_size``.
      batch_size: examples per calibration / evaluation batch.
      max_drop: with labels, the accuracy drop allowed (points); None: no loop.
      ladder: widths a layer is returned to before float by the loop.
      npu: preset name or TOML path for the modelled latency; None skips it.
      requantize_outputs: also put Q/DQ on each GEMM output that the integer path requantizes
        to its consumer's grid (:func:`npujax.backends.onnx_export.to_onnx`): onnxruntime then
        runs those layers in its integer kernels, as :func:`npujax.backends.integer.convert`
        does; npujax's fake-quant does not requantize there, so the outputs differ by more
        than the default tolerance (digits CNN W8A8: 0.43 on logits up to 25, 1.7 %).
      ort_check: run the exported file in onnxruntime at every optimization level.
      ort_examples: examples of the evaluation split fed to onnxruntime (one batch).
      ort_tolerance: see :data:`ORT_TOLERANCE`.
      sensitivity_examples: examples for the sensitivity split and the per-layer SQNR.
      progress: progress on stderr.
    """

    observer: str = "minmax"
    methods: tuple[PTQMethod, ...] = ()
    bias_correction: bool = True
    bias_correction_mode: str = "model"
    bias_correction_guard: bool = True
    calib_examples: int = 256
    batch_size: int = 64
    max_drop: float | None = None
    ladder: tuple[int, ...] = (8,)
    npu: str | None = "edge_16x16"
    requantize_outputs: bool = False
    ort_check: bool = True
    ort_examples: int = 1024
    ort_tolerance: float = ORT_TOLERANCE
    sensitivity_examples: int = 128
    progress: bool = False

    def __post_init__(self) -> None:
        if self.observer not in OBSERVERS:
            raise ConfigError(f"QuantizeConfig.observer must be one of {list(OBSERVERS)}, got "
                              f"{self.observer!r}.")
        if self.bias_correction_mode not in BIAS_CORRECTION_MODES:
            raise ConfigError(f"QuantizeConfig.bias_correction_mode must be one of "
                              f"{list(BIAS_CORRECTION_MODES)}, got "
                              f"{self.bias_correction_mode!r}.")
        for f in ("calib_examples", "batch_size", "ort_examples", "sensitivity_examples"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"QuantizeConfig.{f} must be a positive int, got {v!r}.")
        bad = [m for m in self.methods if not isinstance(m, PTQMethod)]
        if bad:
            raise ConfigError(f"QuantizeConfig.methods must be PTQMethod instances, got "
                              f"{type(bad[0]).__name__}.")
        if self.max_drop is not None and not (math.isfinite(self.max_drop)
                                              and self.max_drop >= 0):
            raise ConfigError(f"QuantizeConfig.max_drop must be a finite number of points >= 0, "
                              f"got {self.max_drop!r}.")
        if not (math.isfinite(self.ort_tolerance) and self.ort_tolerance > 0):
            raise ConfigError(f"QuantizeConfig.ort_tolerance must be > 0, got "
                              f"{self.ort_tolerance!r}.")


@dataclasses.dataclass(frozen=True)
class QuantizeResult:
    """What :func:`quantize_model` produced.

    Attributes:
      graph, params, quant, qstate: the quantized model (params after the methods and bias
        correction; ``quant`` after the accuracy loop).
      layers: per-layer rows (``name, op, weight_bits, act_bits, sqnr_db, weight_sqnr_db,
        act_sqnr_db, dominant, latency_us``), worst ``sqnr_db`` first.
      float_accuracy, accuracy: top-1 accuracy (percent) of the float and fake-quant model on
        the evaluation split; None without labels.
      control: what the accuracy-bounded loop did (None without ``max_drop``).
      latency_s: modelled latency of one inference on ``npu`` (None when skipped).
      npu: the preset's name.
      onnx: the exported model (serialized).
      ort: per optimization level ``{"max_abs_diff", "accuracy", "fake_quant_accuracy",
        "top1_agreement", "examples_beyond_bound"}`` (percent; :func:`ort_outliers`)
        on the first ``ort_examples`` evaluation examples (accuracies None without labels;
        None: check skipped).
      ort_bound: the absolute bound the check used.
      notes: the PTQ methods' notes.
      examples: ``{"calibration": n, "evaluation": n}``.
      calibration: how the model was calibrated: ``{"observer": name, "bias_correction":
        mode of npujax.quantize.ptq.BIAS_CORRECTION_MODES or None (off),
        "bias_correction_guard": None (no guard) or {"kept": "corrected" | "uncorrected",
        "calibration_output_sqnr_db": {"uncorrected": dB, "corrected": dB}}}``.
      vs_float: the fake-quant model's outputs against the float model's on the evaluation
        examples, labels or not (:func:`output_vs_float`).
      ort_drift: None, or, when the end-to-end outputs exceeded the bound at some level but
        every Q/DQ pair equals fake-quant teacher-forced (:data:`TEACHER_FORCED_EXAMPLES`) and
        the drift starts as a rounding tie (:data:`TIE_FLIPS`):
        ``{"levels": [levels beyond the bound], "starts_at": {"pair": QuantizeLinear node name,
        "values_differing", "values"}, "largest_difference": float,
        "fraction_beyond_bound": the largest fraction of examples beyond it at one level,
        "teacher_forced": {"examples", "pairs", "values", "mismatches"}}``.
    """

    graph: Graph
    params: Params
    quant: QuantSpec
    qstate: dict[str, Any]
    layers: list[dict[str, Any]]
    float_accuracy: float | None
    accuracy: float | None
    control: AccuracyControl | None
    latency_s: float | None
    npu: str | None
    onnx: bytes
    ort: dict[str, dict[str, float | None]] | None
    ort_bound: float | None
    notes: tuple[str, ...]
    examples: dict[str, int]
    calibration: dict[str, Any] = dataclasses.field(default_factory=dict)
    ort_drift: dict[str, Any] | None = None
    vs_float: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        """The JSON-ready summary written as ``quantize.json`` (infinite SQNRs as None)."""
        c = self.control
        return {
            "float_accuracy": self.float_accuracy, "accuracy": self.accuracy,
            "drop": (None if self.accuracy is None or self.float_accuracy is None
                     else self.float_accuracy - self.accuracy),
            "latency_s": self.latency_s, "npu": self.npu, "examples": self.examples,
            "calibration": self.calibration,
            "onnxruntime": self.ort, "onnxruntime_bound": self.ort_bound,
            "onnxruntime_drift": self.ort_drift,
            "vs_float": None if self.vs_float is None else {
                **self.vs_float, "output_sqnr_db": _finite(self.vs_float["output_sqnr_db"])},
            "methods": list(self.notes),
            "accuracy_control": None if c is None else {
                "max_drop": c.max_drop, "met": c.met, "initial_accuracy": c.initial_accuracy,
                "steps": [{"layer": s.layer, "before": list(s.before),
                           "after": None if s.after is None else list(s.after),
                           "weight_sqnr_db": _finite(s.sensitivity.weight_sqnr_db),
                           "act_sqnr_db": _finite(s.sensitivity.act_sqnr_db),
                           "accuracy": s.accuracy, "drop": s.drop} for s in c.steps]},
            "layers": [{k: _finite(v) for k, v in r.items()} for r in self.layers],
        }


def _finite(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _batches(x: np.ndarray, size: int) -> list[np.ndarray]:
    return [x[i:i + size] for i in range(0, len(x), size)]


def _predict(graph: Graph, params: Params, x: np.ndarray, size: int,
             quant: QuantSpec | None = None, qstate: dict[str, Any] | None = None) -> np.ndarray:
    fn = jax.jit(lambda p, s, xb: execute(graph, p, xb, quant=quant, qstate=s))
    return np.concatenate([np.asarray(fn(params, qstate, jnp.asarray(b))) for b in
                           _batches(x, size)])


def check_labels(y: np.ndarray, outputs: np.ndarray, *, more: np.ndarray | None = None) -> None:
    """Refuse labels that cannot be top-1 targets of ``outputs``.

    Args:
      y: int labels of the examples ``outputs`` were computed on, ``(n,)``.
      outputs: the model's outputs on them.
      more: labels of other examples (the calibration split), checked against the classes only.

    Raises:
      ShapeError: outputs that are not ``(n, classes)`` scores, a label count that differs from
        the examples', or a label outside ``[0, classes)``.
    """
    if outputs.ndim != 2:
        raise ShapeError(f"labels were given, but the model's output has shape "
                         f"{tuple(outputs.shape)}, not (examples, classes) scores; drop 'y' "
                         "from --data (accuracy is measured on class scores).")
    if len(y) != len(outputs):
        raise ShapeError(f"--data has {len(y)} labels for {len(outputs)} examples.")
    every = y if more is None or not len(more) else np.concatenate([y, more])
    lo, hi, classes = int(every.min()), int(every.max()), outputs.shape[1]
    if lo < 0 or hi >= classes:
        raise ShapeError(f"--data labels range over [{lo}, {hi}], but the model scores "
                         f"{classes} classes (labels 0..{classes - 1}); the labels do not "
                         "match the model's outputs.")


def _accuracy(scores: np.ndarray, y: np.ndarray) -> float:
    return 100.0 * float(np.mean(scores.argmax(-1) == y))


def quantize_model(
    graph: Graph,
    params: Params,
    quant: QuantSpec,
    x_calib: np.ndarray,
    x_eval: np.ndarray,
    y_eval: np.ndarray | None,
    config: QuantizeConfig = QuantizeConfig(),
    *,
    y_calib: np.ndarray | None = None,
) -> QuantizeResult:
    """Quantize a float model (see the module docstring for the steps).

    Args:
      graph: the optimized float model (BN folded).
      params: its float params.
      quant: the precision to reach (:func:`npujax.quant_spec`, rules or a policy).
      x_calib: float32 calibration inputs ``(n, ...)`` in the model's layout.
      x_eval: float32 held-out inputs (accuracy, the onnxruntime check).
      y_eval: int labels of ``x_eval`` ``(n,)``, or None.
      config: the settings.
      y_calib: labels of ``x_calib`` if any (only checked against the model's classes).

    Returns:
      A :class:`QuantizeResult`.

    Raises:
      ConfigError: ``max_drop`` without labels; an empty spec.
      ShapeError: labels that do not match the model's outputs (:func:`check_labels`).
      CalibrationError: NaN/inf reaching a layer.
      QuantizationError: the exported file's onnxruntime outputs differ from npujax's
        fake-quant outputs by more than the tolerance at some optimization level.
    """
    if not quant:
        raise ConfigError("the precision leaves every layer in float; nothing to quantize "
                          "(check --weight-bits/--act-bits, --rule or --policy).")
    if config.max_drop is not None and y_eval is None:
        raise ConfigError("--max-drop needs labelled data (an .npz with 'y', class "
                          "sub-folders, or a labelled built-in source) to measure accuracy.")
    progress = config.progress
    # a batch folded into a Reshape (a model imported at batch 1) unfolded where proved: every
    # pass below then runs the batch directly instead of mapping the graph over its examples
    # (jax.vmap), and the file gets a dynamic batch
    graph, params = unfold_batch(graph, params)
    calib = _batches(np.asarray(x_calib[:config.calib_examples], np.float32), config.batch_size)
    x_eval = np.asarray(x_eval, np.float32)
    with phase("quantize: float model on the evaluation data", progress):
        y_float = _predict(graph, params, x_eval, config.batch_size)
    float_acc = None
    if y_eval is not None:
        check_labels(y_eval, y_float, more=y_calib)
        float_acc = _accuracy(y_float, y_eval)
    notes: list[str] = []
    pre = [m for m in config.methods if m.stage == "pre_calibration"]
    post = [m for m in config.methods if m.stage == "post_calibration"]
    g, p = graph, params
    for m in pre:
        with phase(f"quantize: {m.name}", progress):
            step = m.apply(g, p, quant, calib, None)
        _warn_changed_widths(m.name, quant, step.quant)
        g, p, quant = step.graph, step.params, step.quant
        notes += [f"{m.name}: {n}" for n in step.notes]
    # the float model the report measures against (pre-calibration methods keep its function;
    # post-calibration ones and bias correction move the weights and biases that deploy)
    g_float, p_float = g, p
    guard: dict[str, Any] = {}  # the last run's bias-correction guard

    def run(spec: QuantSpec) -> tuple[Graph, Params, QuantSpec, dict[str, Any], list[str]]:
        gg, pp = g, p
        qstate = calibrate(gg, pp, calib, spec, observer=config.observer)
        said = []
        for m in post:
            with phase(f"quantize: {m.name}", progress):
                st = m.apply(gg, pp, spec, calib, qstate)
            _warn_changed_widths(m.name, spec, st.quant)
            gg, pp, spec = st.graph, st.params, st.quant
            qstate = st.qstate if st.qstate is not None else qstate
            said += [f"{m.name}: {n}" for n in st.notes]
        check = None
        if config.bias_correction and config.bias_correction_guard:
            pp, check = guarded_bias_correction(gg, pp, spec, calib, qstate,
                                                mode=config.bias_correction_mode,
                                                reference=(g_float, p_float))
        elif config.bias_correction:
            pp = bias_correction(gg, pp, spec, calib, qstate,
                                 mode=config.bias_correction_mode)
        if check is not None:
            guard.clear()
            guard.update(kept="corrected" if check.kept else "uncorrected",
                         calibration_output_sqnr_db={
                             "uncorrected": _finite(check.sqnr_db_uncorrected),
                             "corrected": _finite(check.sqnr_db_corrected)})
        # the biases the file holds (int32 on the accumulator's grid): fake-quant, the
        # accuracy loop and the report then measure the model that is written
        pp = deployed_biases(gg, pp, spec, qstate)
        return gg, pp, spec, qstate, said

    sens_x = _batches(np.asarray(x_calib[:config.sensitivity_examples], np.float32),
                      config.batch_size)
    control = None
    last: dict[str, Any] = {}  # the loop's last quantized model (the spec it ends with)
    if config.max_drop is not None:
        assert y_eval is not None and float_acc is not None

        # the loop ranks the layers on the data it measures its drop on (as NNCF's ranks on
        # its validation set): measured on the calibration inputs, a grid fitted to them
        # hides the error that unrepresentative calibration causes (digits calibrated on
        # dimmed images: fc1 ranked first and returned to float without effect, then conv1)
        sens_eval = _batches(x_eval[:config.sensitivity_examples], config.batch_size)

        def evaluate(spec):
            gg, pp, spec2, qstate, said = run(spec)
            yq = _predict(gg, pp, x_eval, config.batch_size, spec2, qstate)
            last.clear()
            last.update(graph=gg, params=pp, quant=spec2, qstate=qstate, notes=said, y_q=yq)
            return _accuracy(yq, y_eval), last.copy()

        def sensitivity(spec, state, layers):
            return sensitivity_split(state["graph"], state["params"], state["quant"],
                                     state["qstate"], sens_eval, layers=layers,
                                     reference_params=p_float if state["graph"] is g_float
                                     else None)

        with phase(f"quantize: accuracy control (max drop {config.max_drop} points)",
                   progress):
            control = accuracy_control(
                quant, evaluate, sensitivity, float_acc, config.max_drop,
                ladder=config.ladder,
                on_step=lambda s: note(f"returned {s.layer} to "
                                       f"{'float' if s.after is None else s.after}: drop "
                                       f"{s.drop:.2f} points", progress))
        quant = control.quant
        if not quant:
            log.warning("the accuracy loop returned every layer to float; the written model "
                        "is the float model.")
    if last:  # the loop ended on this spec: its model is already quantized and evaluated
        g, p, quant, qstate, y_q = (last[k] for k in ("graph", "params", "quant", "qstate",
                                                      "y_q"))
        notes += last["notes"]
    else:
        with phase("quantize: calibration" + (", methods" if post else "") +
                   (", bias correction" if config.bias_correction else ""), progress):
            g, p, quant, qstate, said = run(quant)
            y_q = _predict(g, p, x_eval, config.batch_size, quant, qstate)
        notes += said
    with phase("quantize: per-layer report", progress):
        acc = None if y_eval is None else _accuracy(y_q, y_eval)
        split = {r.name: r for r in sensitivity_split(
            g, p, quant, qstate, sens_x, whole_model=True,
            reference_params=p_float if g is g_float else None)} if quant else {}
    latency_s, per_layer, npu = None, {}, None
    if config.npu is not None:
        from npujax.hw import load_npu_spec
        from npujax.plan.lower import lower

        spec = load_npu_spec(config.npu)
        with phase(f"quantize: latency on {spec.name}", progress):
            sched = lower(g, spec, quant)
        latency_s, npu = sched.latency_s, spec.name
        per_layer = {r.name: r.latency_s for r in sched.layers}
    rows = _layer_rows(quant, split, per_layer)
    vs_float = output_vs_float(y_q, y_float)
    if vs_float["far"]:
        log.warning("the quantized model against float: %s", describe_vs_float(vs_float))
    onnx_bytes, ort, bound, drift = _export_and_check(g, p, quant, qstate, x_eval, y_eval,
                                                      y_q, y_float, config)
    return QuantizeResult(g, p, quant, qstate, rows, float_acc, acc, control, latency_s, npu,
                          onnx_bytes, ort, bound, tuple(notes),
                          {"calibration": sum(len(b) for b in calib),
                           "evaluation": len(x_eval)},
                          {"observer": config.observer,
                           "bias_correction": (config.bias_correction_mode
                                               if config.bias_correction else None),
                           "bias_correction_guard": dict(guard) or None},
                          ort_drift=drift, vs_float=vs_float)


#: Below these the quantized model's outputs are reported as far from the float model's
#: (a warning, and a line in report.md): the output SQNR (dB), and the top-1 agreement (%).
FAR_SQNR_DB = 10.0
FAR_AGREEMENT = 90.0
#: Below this many evaluation examples the comparison with float is said to be too few to judge
#: (one example moves a top-1 agreement by 1/n).
MIN_JUDGED_EXAMPLES = 32


def output_vs_float(y_q: np.ndarray, y_float: np.ndarray) -> dict[str, Any]:
    """How far the fake-quant model's outputs are from the float model's, without labels.

    Args:
      y_q: the fake-quant model's outputs, float ``[n, ...]``.
      y_float: the float model's outputs on the same examples, the same shape.

    Returns:
      ``{"output_sqnr_db": 10 log10(sum y_float^2 / sum (y_q - y_float)^2) (inf if equal),
      "top1_agreement": the percentage of positions whose arg-max over the last axis agree
      (percent, as the accuracies and onnxruntime's agreement in ``quantize.json``), for
      class scores ``[n, classes]`` or per-step scores ``[n, steps, classes]`` (None for other
      outputs), "far": below :data:`FAR_SQNR_DB` or :data:`FAR_AGREEMENT`, "examples": n,
      "too_few": n below :data:`MIN_JUDGED_EXAMPLES`}``.
    """
    from npujax.quantize.ptq import sqnr_db

    q = np.asarray(y_q, np.float64)
    f = np.asarray(y_float, np.float64)
    db = sqnr_db(float(np.sum(f * f)), float(np.sum((q - f) ** 2)))
    agree = (100.0 * float(np.mean(np.argmax(q, axis=-1) == np.argmax(f, axis=-1)))
             if f.ndim in (2, 3) and f.shape[-1] > 1 else None)
    far = db < FAR_SQNR_DB or (agree is not None and agree < FAR_AGREEMENT)
    n = int(f.shape[0])
    return {"output_sqnr_db": db, "top1_agreement": agree, "far": bool(far), "examples": n,
            "too_few": n < MIN_JUDGED_EXAMPLES}


def _warn_changed_widths(method: str, before: QuantSpec, after: QuantSpec) -> None:
    """Say on the console when a PTQ method set other widths than the ones asked for (GPTQ
    quantizes its layers at its own bits), so the headline widths are not taken for the
    file's."""
    def widths(lq: LayerQuant | None) -> tuple[Any, Any]:
        return (None, None) if lq is None else (lq.weight_candidates, lq.act)

    changed = sorted(n for n in {*before, *after}
                     if widths(before.get(n)) != widths(after.get(n)))
    if changed:
        log.warning("%s changed the formats of %d layer(s) from the ones asked for: %s (see "
                    "report.md and layers.csv)", method, len(changed),
                    ", ".join(changed[:8]) + (" ..." if len(changed) > 8 else ""))


def _layer_rows(quant: QuantSpec, split: dict[str, LayerSensitivity],
                latency: dict[str, float]) -> list[dict[str, Any]]:
    """Report rows; an operand left in float has no sensitivity (None, not inf)."""
    rows = [{"name": s.name, "op": s.op, "weight_bits": s.weight_bits, "act_bits": s.act_bits,
             "sqnr_db": s.layer_sqnr_db,
             "weight_sqnr_db": None if quant[s.name].weight is None else s.weight_sqnr_db,
             "act_sqnr_db": None if quant[s.name].act is None else s.act_sqnr_db,
             "dominant": s.dominant,
             "latency_us": None if s.name not in latency else latency[s.name] * 1e6}
            for s in split.values()]
    return sorted(rows, key=lambda r: r["sqnr_db"])


def _export_and_check(graph: Graph, params: Params, quant: QuantSpec, qstate: dict[str, Any],
                      x_eval: np.ndarray, y_eval: np.ndarray | None, y_q: np.ndarray,
                      y_float: np.ndarray, config: QuantizeConfig
                      ) -> tuple[bytes, dict[str, dict[str, float | None]] | None, float | None,
                                 dict[str, Any] | None]:
    from npujax.backends.onnx_export import to_onnx

    with phase("quantize: QDQ ONNX export", config.progress):
        model = to_onnx(graph, params, quant, qstate, dynamic_batch=True,
                        requantize_outputs=config.requantize_outputs,
                        full_check=True).SerializeToString()
    if not config.ort_check:
        return model, None, None, None
    from npujax.backends.onnx_export import exported_biases
    from npujax.backends.ort_check import run_onnxruntime_levels

    n = min(config.ort_examples, len(x_eval))
    biases = exported_biases(model)
    # the reference: npujax's fake-quant with the file's int32 biases, which the params hold
    # already (deployed_biases); recomputed only if the file holds other ones
    differ = {k: b for k, b in biases.items()
              if not np.array_equal(np.asarray(params[k]["bias"], np.float32), b)}
    written = params
    if differ:
        written = {k: ({**v, "bias": jnp.asarray(differ[k])} if k in differ else v)
                   for k, v in params.items()}
        want = _predict(graph, written, x_eval[:n], config.batch_size, quant, qstate)
    else:
        want = y_q[:n]
    bound = config.ort_tolerance * max(float(np.abs(y_float[:n]).max()), 1e-12)
    with phase(f"quantize: onnxruntime check on {n} examples, 4 optimization levels",
               config.progress):
        outs = run_onnxruntime_levels(model, {graph.inputs[0]: x_eval[:n]})
    ort: dict[str, dict[str, float | None]] = {}
    failed = []  # (level, examples beyond the bound, largest difference)
    off = np.zeros(n)  # per example, the largest difference at a level beyond the bound
    for level, ys in outs.items():
        beyond, allowed, diff = ort_outliers(ys[0].reshape(want.shape), want, bound)
        ort[level] = {"max_abs_diff": diff, "accuracy": None if y_eval is None else
                      _accuracy(ys[0].reshape(want.shape), y_eval[:n]),
                      "fake_quant_accuracy": None if y_eval is None else
                      _accuracy(want, y_eval[:n]),
                      "top1_agreement": 100.0 * float(np.mean(
                          ys[0].reshape(want.shape).argmax(-1) == want.argmax(-1)))
                      if want.ndim == 2 else None}
        ort[level]["examples_beyond_bound"] = beyond
        if beyond > allowed:
            failed.append((level, beyond, diff))
            off = np.maximum(off, np.abs(np.asarray(ys[0], np.float64).reshape(n, -1)
                                         - np.asarray(want, np.float64).reshape(n, -1)).max(1))
    if not failed:
        return model, ort, bound, None
    # the examples that drifted most (a tie may have flipped on none of the first ones)
    worst = np.sort(np.argsort(-np.nan_to_num(off, nan=np.inf), kind="stable")[
        :min(TEACHER_FORCED_EXAMPLES, n)])
    return model, ort, bound, _teacher_forced(model, graph, written, quant, qstate,
                                              x_eval[:n][worst], n, bound, failed, config)


def _teacher_forced(model: bytes, graph: Graph, params: Params, quant: QuantSpec,
                    qstate: dict[str, Any], x: np.ndarray, n: int, bound: float,
                    failed: list[tuple[str, int, float]], config: QuantizeConfig
                    ) -> dict[str, Any]:
    """When the end-to-end outputs exceed the bound: accept the file if every Q/DQ pair equals
    fake-quant teacher-forced (:func:`npujax.backends.ort_check.qdq_pair_mismatches` on ``x``,
    the :data:`TEACHER_FORCED_EXAMPLES` examples that drifted most) and the drift starts as
    rounding ties do
    (at the first pair whose output differs from fake-quant's, few values, one grid step
    apart: :data:`TIE_FLIPS`), and return the drift to record; else raise. The second test
    covers what the pairs do not: a wrong weight, bias or operator upstream of a pair moves
    most of its values by many steps.

    Raises:
      QuantizationError: a pair differs teacher-forced (names the first), the drift does not
        start as a rounding tie (names the pair where it starts), or the file has no pair.
    """
    from npujax.backends.ort_check import qdq_pair_mismatches
    from npujax.ir.execute import tap

    level, beyond, diff = max(failed, key=lambda f: (f[1], f[2]))
    k = len(x)
    with phase(f"quantize: teacher-forced Q/DQ check on {k} examples", config.progress):
        _, taps = jax.jit(lambda p, s, xb: execute(graph, p, xb, quant=quant, qstate=s,
                                                   observe=tap(list(quant))))(
            params, qstate, jnp.asarray(x))
        ref = {f"{name}/{what}_quant": np.asarray(t[i]) for name, t in taps.items()
               for i, what in ((0, "act"), (2, "operand")) if i < len(t)}
        check = qdq_pair_mismatches(model, graph, quant, qstate, {graph.inputs[0]: x},
                                    reference=ref)
    end_to_end = (f"the exported model's onnxruntime outputs at {level} differ from npujax's "
                  f"fake-quant outputs beyond {bound:.3g} (= {config.ort_tolerance} x the "
                  f"largest float output) on {beyond} of {n} examples (largest {diff:.3g})")
    first = check.first_divergence
    why = None
    if not check.pairs:
        why = "and the file has no activation Q/DQ pair to check teacher-forced"
    elif check.mismatches:
        why = (f"and teacher-forced its Q/DQ pair {check.first_mismatch!r} differs from "
               f"fake-quant ({check.mismatches} of {check.values} values on {k} examples)")
    elif first is None:
        why = ("and no Q/DQ pair's output differs from fake-quant on the "
               f"{k} examples that drifted most, so the difference is not a rounding tie's")
    elif first[1] > max(1, TIE_FLIPS * first[2]) or first[3] > 1.0 + 1e-3:
        why = (f"and it starts at Q/DQ pair {first[0]!r} ({first[1]} of {first[2]} values, up "
               f"to {first[3]:.3g} grid steps apart), not as a rounding tie")
    if why is not None:
        raise QuantizationError(f"{end_to_end}, {why}; nothing was written. Report this with "
                                "the model, or pass --ort-tolerance to accept it.")
    assert first is not None  # (why is set when it is None)
    log.warning("%s, which rounding ties compound through the layers: every Q/DQ pair (%d, %d "
                "values on %d examples) equals fake-quant teacher-forced, so the file is "
                "written (see report.md)", end_to_end, len(check.pairs), check.values, k)
    return {"levels": [f[0] for f in failed], "starts_at": {
                "pair": first[0], "values_differing": first[1], "values": first[2]},
            "largest_difference": max(f[2] for f in failed),
            "fraction_beyond_bound": max(f[1] for f in failed) / n,
            "teacher_forced": {"examples": k, "pairs": len(check.pairs),
                               "values": check.values, "mismatches": check.mismatches}}


def write_quantize_outputs(out: str | os.PathLike[str], result: QuantizeResult,
                           title: str) -> tuple[str, ...]:
    """Write :data:`QUANTIZE_FILES` into ``out`` (all of them or none, ``staged_dir``).

    Files: ``model.qdq.onnx`` (the QDQ model), ``layers.csv`` (one row per layer),
    ``report.md`` (accuracy, latency, onnxruntime check, the accuracy loop's steps and the layer
    table) and ``quantize.json`` (:meth:`QuantizeResult.summary`).

    Returns:
      The file names written.
    """
    from npujax.report import write_json

    with staged_dir(Path(out)) as stage:
        atomic_write_bytes(stage / "model.qdq.onnx", result.onnx)
        (stage / "layers.csv").write_text(layers_csv_text(result.layers))
        (stage / "report.md").write_text(quantize_markdown(result, title))
        write_json(stage / "quantize.json", result.summary())
    return QUANTIZE_FILES


def method_instances(names: Sequence[str]) -> tuple[PTQMethod, ...]:
    """The registered PTQ methods called ``names`` (:data:`npujax.quantize.methods.PTQ_METHODS`)
    with their default hyper-parameters, in the order given.

    Raises:
      ConfigError: an unknown name (lists the registered ones).
    """
    from npujax.quantize.methods import PTQ_METHODS

    unknown = [n for n in names if n not in PTQ_METHODS]
    if unknown:
        raise ConfigError(f"unknown PTQ method(s) {unknown}; registered: "
                          f"{sorted(PTQ_METHODS) or 'none'}.")
    return tuple(PTQ_METHODS[n]() for n in names)
