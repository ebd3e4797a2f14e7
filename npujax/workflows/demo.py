"""The end-to-end demo: float training, one Graph, PTQ, QAT, precision search and NPU lowering.

``run_demo(DemoConfig())`` is what ``npujax demo`` runs. Every stage after float training uses the
one Graph traced from the trained Flax model.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from flax import nnx
from rich.console import Console

from npujax._atomic import check_output_dir, refuse_foreign, staged_dir
from npujax.data.datasets import load_digits_nhwc
from npujax.errors import ConfigError
from npujax.frontends.flax import trace_flax
from npujax.hw import NpuSpec, load_npu_spec
from npujax.ir.passes import optimize
from npujax.models.cnn import DigitsCNN
from npujax.models.train import train_float
from npujax.plan import lower
from npujax.plan.lower import lower_dataflows
from npujax.quantize.calibrate import calibrate
from npujax.quantize.model_file import save_graph
from npujax.quantize.spec import quant_spec
from npujax.quantize.train import TrainConfig, evaluate, train_graph
from npujax.report import (
    layer_table,
    plot_breakdown,
    plot_layer_latency,
    plot_roofline,
    write_json,
    write_layers_csv,
)
from npujax.report.lowering import print_lowering
from npujax.search import SEARCHERS, SearchConfig, search_precision

__all__ = ["DemoConfig", "run_demo", "default_out_dir", "DEMO_FILES"]


#: The files :func:`run_demo` writes into its output folder.
DEMO_FILES = ("report.json", "layers_int8.csv", "layers_mixed.csv", "layer_latency.png",
              "dataflow_latency.png", "breakdown_mixed.png", "roofline.png", "model.npz")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """Settings of the demo (defaults: the full run, about a minute on 2 CPU cores).

    Attributes:
      npu: hardware preset name or TOML path.
      out: output folder; default ``runs/<timestamp>``.
      seed: seed of the split, the initialisation and the shuffling.
      float_epochs: epochs of float training (Adam, cosine decay).
      float_learning_rate: peak learning rate of float training.
      batch_size: mini-batch size everywhere.
      calibration_batches: batches of training images used for PTQ calibration.
      qat_steps: W8A8 QAT fine-tuning steps.
      search_steps: joint weight/bit-logit steps of the precision search.
      finetune_steps: QAT steps with the searched policy.
      candidates: candidate weight widths of the search.
      search_method: a searcher of :data:`npujax.search.SEARCHERS` (``gradient``, ``ilp`` or
        ``greedy``).
      budget_ratio: latency budget of the search as a fraction of the INT8 latency.
      progress: show progress bars.

    Raises:
      ConfigError: an unknown searcher, or a count below 1 (naming the field).
    """

    npu: str = "edge_16x16"
    out: str | None = None
    seed: int = 0
    float_epochs: int = 30
    float_learning_rate: float = 3e-3
    batch_size: int = 64
    calibration_batches: int = 8
    qat_steps: int = 300
    search_steps: int = 300
    finetune_steps: int = 300
    candidates: tuple[int, ...] = (2, 4, 8)
    search_method: str = "gradient"
    budget_ratio: float = 0.75
    progress: bool = True

    def __post_init__(self) -> None:
        if self.search_method not in SEARCHERS:
            raise ConfigError(f"DemoConfig.search_method must be one of "
                              f"{', '.join(SEARCHERS)}, got {self.search_method!r}.")
        for f in ("float_epochs", "qat_steps", "search_steps", "finetune_steps", "batch_size",
                  "calibration_batches"):
            if getattr(self, f) < 1:
                raise ConfigError(f"DemoConfig.{f} must be >= 1, got {getattr(self, f)}.")


def default_out_dir() -> Path:
    """``runs/<UTC timestamp>`` in the current directory (a new folder per run)."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S-%f")
    return Path("runs") / stamp


def _init(make: Callable[[], nnx.Module]) -> nnx.Module:
    """``make()`` with its initialisers compiled as one program: eagerly Flax compiles each
    initialiser op per parameter shape (~20 programs for the demo's CNN, ``_truncated_normal``
    ~1 s each at -O2). The values are the same bit for bit (the same threefry bits, scaled by
    the same multiply)."""
    return nnx.jit(make)()


def run_demo(config: DemoConfig = DemoConfig(), console: Console | None = None) -> dict[str, Any]:
    """Run the whole pipeline and write :data:`DEMO_FILES` (report, CSVs, plots, model file).

    Returns:
      The report dict (also written to ``<out>/report.json``); ``report["out_dir"]`` is the folder.

    Raises:
      ConfigError: bad preset or settings, or an output folder that cannot be created.
      OutputError: the output folder is a file, holds a file of the demo's names that npujax
        did not write (kept; refused before the work), or the files cannot be written (the
        folder then keeps its previous contents; see ``npujax._atomic.staged_dir``).
    """
    console = console or Console()
    t0 = time.perf_counter()
    spec: NpuSpec = load_npu_spec(config.npu)
    out = Path(config.out) if config.out else default_out_dir()
    check_output_dir(out)  # before the work: a file of that name fails now,
    refuse_foreign(out, DEMO_FILES)  # and so does a user's file under one of the demo's names
    data = load_digits_nhwc(seed=config.seed)
    console.print(f"[bold]npujax demo[/] — digits {len(data.x_train)} train / "
                  f"{len(data.x_test)} test, NPU preset [cyan]{spec.name}[/], output {out}")

    # 1-2. float model in Flax
    model = train_float(data, epochs=config.float_epochs, learning_rate=config.float_learning_rate,
                        batch_size=config.batch_size, seed=config.seed, progress=config.progress,
                        model=_init(lambda: DigitsCNN(rngs=nnx.Rngs(config.seed))))

    # 3. one Graph, traced once; BN folded and activations fused as the NPU compiler does
    graph, params = trace_flax(model, data.x_test[:1])
    graph, params = optimize(graph, params)
    xtr, ytr, xte, yte = data.x_train, data.y_train, data.x_test, data.y_test
    float_acc = evaluate(graph, params, xte, yte)
    console.print(f"float accuracy            {float_acc:.4f}")

    # 4. PTQ: per-channel symmetric int8 weights, per-tensor asymmetric uint8 activations, min-max
    q8 = quant_spec(graph, 8, 8)
    bs = config.batch_size
    calib = [xtr[i * bs:(i + 1) * bs] for i in range(config.calibration_batches)]
    qstate = calibrate(graph, params, calib, q8, progress=config.progress)
    ptq_acc = evaluate(graph, params, xte, yte, quant=q8, qstate=qstate)
    console.print(f"PTQ INT8 (W8A8) accuracy  {ptq_acc:.4f}")

    # 5. QAT W8A8 (fake-quant, straight-through estimator)
    qat_params = train_graph(graph, params, xtr, ytr, quant=q8, qstate=qstate, config=TrainConfig(
        steps=config.qat_steps, learning_rate=1e-4, batch_size=bs, seed=config.seed + 1,
        progress=config.progress, description="QAT W8A8")).params
    qat_acc = evaluate(graph, qat_params, xte, yte, quant=q8, qstate=qstate)
    console.print(f"QAT INT8 (W8A8) accuracy  {qat_acc:.4f}")

    # 6. mixed-precision search against the NPU latency model (weights; activations at 8 bits),
    #    then QAT fine-tuning of the W8A8 QAT model with the chosen policy
    search = search_precision(graph, qat_params, spec, xtr, ytr, qstate, SearchConfig(
        method=config.search_method, budget_ratio=config.budget_ratio,
        candidates=config.candidates, act_candidates=(8,), steps=config.search_steps,
        seed=config.seed + 2, progress=config.progress))
    wpolicy = dict(search.policy.weight_bits)
    q_mp = search.policy.quant_spec(graph)
    mp_params = train_graph(graph, qat_params, xtr, ytr, quant=q_mp, qstate=qstate,
                            config=TrainConfig(steps=config.finetune_steps, learning_rate=1e-4,
                                               batch_size=bs, seed=config.seed + 3,
                                               progress=config.progress,
                                               description="QAT mixed precision")).params
    mp_acc = evaluate(graph, mp_params, xte, yte, quant=q_mp, qstate=qstate)

    # 7. lowering
    int8 = lower_dataflows(graph, spec)
    mixed = lower(graph, spec, q_mp)
    console.print(f"mixed precision ({config.search_method} search) {wpolicy}: "
                  f"accuracy {mp_acc:.4f}, "
                  f"latency {mixed.latency_s * 1e6:.3f} µs vs INT8 "
                  f"{int8.schedule.latency_s * 1e6:.3f} µs "
                  f"({int8.schedule.latency_s / mixed.latency_s:.2f}× faster)")
    console.print(f"energy per inference: INT8 {int8.schedule.energy_j * 1e6:,.3f} µJ "
                  f"(EDP {int8.schedule.edp_js:.4g} J·s), mixed {mixed.energy_j * 1e6:,.3f} µJ "
                  f"(EDP {mixed.edp_js:.4g} J·s); area of {spec.name} "
                  f"{int8.schedule.area_mm2:,.3f} mm²")
    print_lowering(console, int8, f"INT8 on {spec.name} ({int8.schedule.dataflow})")
    console.print(layer_table(mixed, f"mixed precision on {spec.name} ({mixed.dataflow})"))

    # 8. outputs, each written atomically
    elapsed = time.perf_counter() - t0
    report = {
        "npu": spec.name,
        "dataflow": int8.schedule.dataflow,
        "float_accuracy": float_acc,
        "ptq_int8_accuracy": ptq_acc,
        "qat_int8_accuracy": qat_acc,
        "mixed_precision": {
            "method": config.search_method,
            "weight_bits": wpolicy,
            "act_bits": 8,
            "accuracy": mp_acc,
            "latency_s": mixed.latency_s,
            "energy_j": mixed.energy_j,
            "energy_breakdown_j": mixed.energy_breakdown_j(),
            "edp_js": mixed.edp_js,
            "budget_s": search.budget_s,
            **({"probabilities": search.details["probabilities"]}
               if "probabilities" in search.details else {}),
            "layers": mixed.to_dict()["layers"],
        },
        "int8_latency_s": int8.schedule.latency_s,
        "int8_breakdown_s": int8.schedule.breakdown_s(),
        "int8_energy_j": int8.schedule.energy_j,
        "int8_energy_breakdown_j": int8.schedule.energy_breakdown_j(),
        "int8_edp_js": int8.schedule.edp_js,
        "area_mm2": int8.schedule.area_mm2,
        "area_breakdown_mm2": int8.schedule.area_breakdown_mm2,
        "peak_activation_bytes": int8.schedule.peak_activation_bytes,
        "dataflow_latency_s": {df: s.latency_s for df, s in int8.by_dataflow.items()},
        "layers": int8.schedule.to_dict()["layers"],
        "config": {k: (list(v) if isinstance(v, tuple) else v)
                   for k, v in dataclasses.asdict(config).items()},
        "runtime_s": elapsed,
        "jax_backend": jax.default_backend(),
    }
    with staged_dir(out) as stage:  # all of the files or none (npujax._atomic)
        write_json(stage / "report.json", report)
        write_layers_csv(stage / "layers_int8.csv", int8.schedule)
        write_layers_csv(stage / "layers_mixed.csv", mixed)
        plot_layer_latency(stage / "layer_latency.png", {"INT8": int8.schedule, "mixed": mixed})
        plot_layer_latency(stage / "dataflow_latency.png", int8.by_dataflow,
                           title=f"INT8 per-layer latency by dataflow on {spec.name}")
        plot_breakdown(stage / "breakdown_mixed.png", mixed)
        plot_roofline(stage / "roofline.png", int8.schedule, spec.peak_macs_per_s,
                      spec.memory.dram_bytes_per_s,
                      title=f"roofline of {spec.name}, INT8 layers (red: memory-bound)")
        save_graph(stage / "model.npz", graph, qat_params, qstate,
                   meta={"weight_bits": 8, "act_bits": 8, "mixed_precision_policy": wpolicy})
    console.print(f"wrote {out}/{', '.join(DEMO_FILES)} ({elapsed:.1f} s)")
    report["out_dir"] = str(out)
    return report
