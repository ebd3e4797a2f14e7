"""The ``npujax fit`` workflow: read a measured profile, fit the preset, report and write.

:func:`fit_profile` loads the model (ONNX or a saved npujax model), charges the profile's names to
its layers (:func:`npujax.plan.profile.match_profile`), fits the chosen preset fields
(:func:`npujax.plan.fit.fit_spec`) and scores the result; :func:`write_fit` writes the fitted
preset (``fitted.toml``, a preset file every command accepts), ``fit.json``, ``fit_layers.csv``
and the scatter plot ``fit.png``; :func:`print_fit` shows the tables.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from npujax._atomic import atomic_write_text
from npujax.hw.spec import NpuSpec, as_spec, spec_to_toml
from npujax.ir.graph import Graph
from npujax.plan.fit import FitConfig, FitResult, fit_metrics, fit_spec, op_class, predict_latency_s
from npujax.plan.profile import MatchedProfile, Profile, match_profile, read_profile
from npujax.plan.program import network
from npujax.plan.workload import Workload
from npujax.report import plot_measured_vs_modelled, write_json

__all__ = ["FitRun", "load_model_graphs", "fit_profile", "print_fit", "write_fit"]


@dataclasses.dataclass(frozen=True)
class FitRun:
    """A finished fit with everything its report shows.

    Attributes:
      model: the model file; profile: the measurements; matched: the profile per layer
        (layers measured as 0 s, below the profiler's resolution, count as unmeasured).
      layers: the model's workloads on the starting preset.
      start: the starting preset; result: the fit.
      before, after: :func:`~npujax.plan.fit.fit_metrics` of the measured layers with the
        starting preset and with the fit (factors and overhead included).
      preset_only: the same for the written preset alone (what ``npujax lower --npu
        fitted.toml`` predicts), when efficiency factors or an overhead were fitted; else None.
    """

    model: str
    profile: Profile
    matched: MatchedProfile
    layers: tuple[Workload, ...]
    start: NpuSpec
    result: FitResult
    before: dict[str, float]
    after: dict[str, float]
    preset_only: dict[str, float] | None
    base: str | None = None


def load_model_graphs(model: str | os.PathLike[str],
                      input_shapes: Mapping[str, Sequence[int]] | None = None
                      ) -> tuple[Graph, Graph]:
    """``(raw, optimized)`` graphs of an ONNX model, a saved npujax model or a Keras
    application (``keras:NAME``, traced already optimized): the graph as imported (names of
    every ONNX node) and after :func:`npujax.optimize` (what is costed).

    Raises:
      ConfigError: ``input_shapes`` for a saved model; see :func:`npujax.from_onnx` and
        :func:`npujax.load_graph` for the rest.
    """
    from npujax.ir.passes import optimize

    if str(model).lower().endswith(".onnx"):
        from npujax.frontends.onnx import from_onnx

        raw, params = from_onnx(model, input_shapes or None, unsupported="fallback")
    else:
        from npujax.workflows.inputs import load_model

        raw, params, _, _ = load_model(model, input_shapes)
    return raw, optimize(raw, params)[0]


def fit_profile(
    profile: Profile | str | os.PathLike[str],
    model: str | os.PathLike[str] | tuple[Graph, Graph],
    npu: NpuSpec | str,
    fields: Sequence[str],
    *,
    config: FitConfig | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    on_unmatched: str = "error",
    progress: Callable[[int, float], None] | None = None,
) -> FitRun:
    """Fit ``npu``'s ``fields`` to a measured per-layer profile of ``model``.

    Args:
      profile: a :class:`~npujax.plan.profile.Profile` or the path of a CSV / onnxruntime JSON.
      model: an ``.onnx`` or saved-model path, or ``(raw, optimized)`` graphs
        (:func:`load_model_graphs`).
      npu: the starting preset (an :class:`~npujax.hw.NpuSpec`, a name or a TOML path).
      fields: the preset fields to fit (``key`` or ``section.key``, see
        :data:`npujax.plan.fit.FITTABLE`).
      config: how to fit (:class:`~npujax.plan.FitConfig`: efficiency factors per op class,
        a per-layer overhead, bounds, Adam steps and rate, the width every layer is costed at,
        the fitted preset's name); None: ``FitConfig()``.
      input_shapes: static input shapes of an ONNX model.
      on_unmatched: ``"error"`` or ``"skip"`` for profile names matching no layer.
      progress: called ``progress(step, loss)`` after every step.

    Returns:
      The :class:`FitRun`.

    Raises:
      ConfigError: a bad profile, preset, field or option; profile names matching no layer.
    """
    config = FitConfig() if config is None else config
    spec = as_spec(npu)
    prof = profile if isinstance(profile, Profile) else read_profile(profile)
    if isinstance(model, tuple):
        raw, graph = model
        model_name = "<graph>"
    else:
        raw, graph = load_model_graphs(model, input_shapes)
        model_name = str(model)
    layers, chains = network(graph, spec)
    matched = match_profile(prof, layers, raw, on_unmatched=on_unmatched)
    keep = matched.measured_s > 0
    if not keep.all():  # below the profiler's resolution: no log error to fit
        zero = tuple(layers[int(i)].name for i in matched.layer_index[~keep])
        matched = dataclasses.replace(
            matched, layer_index=matched.layer_index[keep], measured_s=matched.measured_s[keep],
            names=tuple(n for n, k in zip(matched.names, keep) if k),
            unmeasured=matched.unmeasured + zero)
    result = fit_spec(layers, spec, matched.layer_index, matched.measured_s, fields,
                      config=config, chains=chains, progress=progress)
    preset_only = None
    if result.efficiency or result.overhead_s:
        alone = predict_latency_s(layers, result.spec, bits=config.bits,
                                  chains=chains)[result.layer_index]
        preset_only = fit_metrics(result.measured_s, alone)
    return FitRun(model_name, prof, matched, layers, spec, result,
                  fit_metrics(result.measured_s, result.before_s),
                  fit_metrics(result.measured_s, result.after_s), preset_only,
                  None if isinstance(npu, NpuSpec) else str(npu))


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def parameter_table(run: FitRun) -> Table:
    """Fitted parameters: initial and fitted values, change, relative standard error and
    whether the profile identifies them."""
    r = run.result
    t = Table(title=f"fit of {run.start.name} to {Path(run.profile.source).name} "
                    f"({len(r.measured_s)} layers, {len(r.loss)} Adam steps)",
              title_justify="left")
    for col in ("parameter", "initial", "fitted", "change", "± (1σ)", "identifiable"):
        t.add_column(col, justify="left" if col == "parameter" else "right", overflow="fold")
    rows = [(f, r.initial[f], r.fitted[f]) for f in r.fields]
    rows += [(f"efficiency.{c}", 1.0, v) for c, v in r.efficiency.items()]
    if "overhead_s" in r.rel_std_err:
        rows.append(("overhead_s", 0.0, r.overhead_s))
    for key, v0, v1 in rows:
        change = f"{(v1 / v0 - 1) * 100:+.1f} %" if v0 else ""
        t.add_row(key, _fmt(v0), _fmt(v1), change, f"{r.rel_std_err[key] * 100:.2g} %",
                  "yes" if r.identifiable[key] else
                  ("no: kept at the preset" if key in r.fields else "no"))
    t.caption = ("identifiable: relative standard error <= 10 % (Gauss-Newton at the optimum); "
                 "a preset field the profile does not pin down keeps the preset's value and "
                 "the others are fitted again without it (docs/npu_model.md)")
    return t


def metrics_table(run: FitRun) -> Table:
    """MAPE, Spearman rank correlation, RMS log error and total-latency error, before and after."""
    t = Table(title="per-layer error on the measured layers", title_justify="left")
    for col in ("model", "MAPE %", "Spearman ρ", "RMS log err", "total err %"):
        t.add_column(col, justify="left" if col == "model" else "right")
    rows = [("starting preset", run.before), ("fitted", run.after)]
    if run.preset_only is not None:
        rows.append(("fitted preset alone (no factors)", run.preset_only))
    for label, m in rows:
        t.add_row(label, f"{m['mape']:.2f}", f"{m['spearman']:.3f}", f"{m['rms_log_err']:.3f}",
                  f"{m['total_err_pct']:+.2f}")
    return t


def layer_rows(run: FitRun) -> list[dict[str, Any]]:
    """One dict per measured layer: name, op, class, profile names, measured/before/after
    seconds and the relative errors (%)."""
    r = run.result
    out = []
    for k, i in enumerate(r.layer_index):
        w = run.layers[int(i)]
        m, b, a = float(r.measured_s[k]), float(r.before_s[k]), float(r.after_s[k])
        out.append({"layer": w.name, "op": w.op, "op_class": op_class(w),
                    "profile_names": "+".join(run.matched.names[k]), "measured_s": m,
                    "before_s": b, "after_s": a, "before_err_pct": (b / m - 1) * 100,
                    "after_err_pct": (a / m - 1) * 100})
    return out


def layer_error_table(run: FitRun, limit: int = 20) -> Table:
    """The ``limit`` slowest measured layers with their error before and after the fit."""
    rows = sorted(layer_rows(run), key=lambda d: -d["measured_s"])[:limit]
    t = Table(title=f"slowest {len(rows)} of {len(run.result.measured_s)} measured layers",
              title_justify="left")
    for col in ("layer", "op", "measured µs", "before µs", "err", "after µs", "err"):
        t.add_column(col, justify="left" if col in ("layer", "op") else "right",
                     overflow="fold")
    for d in rows:
        t.add_row(d["layer"], d["op"], f"{d['measured_s'] * 1e6:,.2f}",
                  f"{d['before_s'] * 1e6:,.2f}", f"{d['before_err_pct']:+.1f} %",
                  f"{d['after_s'] * 1e6:,.2f}", f"{d['after_err_pct']:+.1f} %")
    return t


def print_fit(console: Console, run: FitRun) -> None:
    """The parameter, metric and per-layer tables, and what the profile left out."""
    console.print(parameter_table(run))
    console.print(metrics_table(run))
    console.print(layer_error_table(run))
    m = run.matched
    if m.skipped:
        console.print(f"{len(m.skipped)} profile name(s) matched no layer and were skipped: "
                      + ", ".join(m.skipped[:8]) + (" ..." if len(m.skipped) > 8 else ""))
    if m.unmeasured:
        console.print(f"{len(m.unmeasured)} layer(s) had no measurement and were not fitted: "
                      + ", ".join(m.unmeasured[:8]) + (" ..." if len(m.unmeasured) > 8 else ""))


def fit_to_dict(run: FitRun) -> dict[str, Any]:
    """The report as a JSON-ready dict."""
    r = run.result
    return {
        "model": run.model, "profile": run.profile.source, "profile_format": run.profile.format,
        "start_preset": run.start.name, "fitted_preset": r.spec.name,
        "fields": list(r.fields), "bits": r.bits, "initial": r.initial, "fitted": r.fitted,
        "efficiency": r.efficiency, "overhead_s": r.overhead_s,
        "rel_std_err": r.rel_std_err, "identifiable": r.identifiable,
        "before": run.before, "after": run.after, "preset_only": run.preset_only,
        "steps": len(r.loss), "loss_first": float(r.loss[0]), "loss_last": float(r.loss[-1]),
        "skipped_profile_names": list(run.matched.skipped),
        "unmeasured_layers": list(run.matched.unmeasured),
        "layers": layer_rows(run),
    }


def write_fit(out: str | Path, run: FitRun) -> list[str]:
    """Write ``fitted.toml``, ``fit.json``, ``fit_layers.csv`` and ``fit.png`` into ``out``
    (each atomically; call inside ``npujax._atomic.staged_dir`` for the whole folder).

    Returns:
      The names of the files written.
    """
    out = Path(out)
    r = run.result
    extra = ""
    if r.efficiency or r.overhead_s:
        extra = ("\nThe fit also found factors no preset field holds (efficiency "
                 f"{ {k: round(v, 4) for k, v in r.efficiency.items()} }, per-layer overhead "
                 f"{r.overhead_s:.3g} s); see fit.json.")
    header = (f"Fitted by 'npujax fit' from {run.start.name} to the profile "
              f"{Path(run.profile.source).name} of {Path(run.model).name}.\n"
              f"Fitted fields: {', '.join(r.fields)}; MAPE {run.before['mape']:.2f} % -> "
              f"{run.after['mape']:.2f} %, Spearman {run.after['spearman']:.3f}." + extra)
    atomic_write_text(out / "fitted.toml", spec_to_toml(
        r.spec, header, base=run.base, notes={f: "fitted by npujax fit" for f in r.fields}))
    write_json(out / "fit.json", fit_to_dict(run))
    rows = layer_rows(run)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    for d in rows:
        w.writerow({k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in d.items()})
    atomic_write_text(out / "fit_layers.csv", buf.getvalue())
    series = {f"{run.start.name} (MAPE {run.before['mape']:.1f} %)": r.before_s,
              f"fitted (MAPE {run.after['mape']:.1f} %)": r.after_s}
    plot_measured_vs_modelled(out / "fit.png", r.measured_s, series,
                              f"{Path(run.model).name}: measured vs modelled")
    return ["fitted.toml", "fit.json", "fit_layers.csv", "fit.png"]
