"""Realities around the NPU (issue 32, items 2 and 3): thermal throttling on the Coral Dev Board,
and the pipeline around the NPU (host pre- and post-processing, copies, overlap).

Usage:  python experiments/realities/main.py [--out realities_out]

(``docs/results/realities.md`` was made with ``--out docs/results``: it writes
``realities_thermal.png``, ``realities_pipeline.png`` and ``realities.json`` there and prints
the tables of the page.)

Models (random or stored weights: latency needs only shapes): DenseNet-121 and Inception v2
from the ONNX package's backend test data (``onnx/backend/test/data/light``: the real
architectures at 1x3x224x224), and YOLOv8n at 640x640 (``yolov8n.py`` here: ultralytics'
``yolov8.yaml`` at the n scale, 4.37 GMACs = 8.7 GFLOPs as ultralytics states). Preset:
``coral_devboard`` with its ``[thermal]`` section. YOLOv8n's nearest 2x upsampling traces as
a broadcast (Expand), which the Edge TPU runs as its Resize: the experiment lists Expand as
supported for that model (``ops.supported``), or the compiler's partition would send the rest of
the graph to the host.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np

from npujax._atomic import atomic_write_text
from npujax.hw import load_npu_spec
from npujax.plan import lower
from npujax.plan.host_pipeline import parse_host_stage
from npujax.plan.thermal import sustained, throttled_specs
from npujax.workflows.lowering import import_onnx_for_lowering, pipeline_lowering

sys.path.insert(0, str(Path(__file__).parent))
from yolov8n import yolov8n_graph  # noqa: E402

PRACTITIONER = (12e-3, 18e-3, 300.0)  # cold, after 5 minutes of continuous inference (s)
R_SWEEP = (20.0, 25.0, 30.0, 35.0, 40.0, 45.0, 50.0, 60.0, 70.0, 80.0)


def light(name: str) -> str:
    import onnx

    return str(Path(onnx.__file__).parent / "backend/test/data/light" / f"light_{name}.onnx")


def thermal_part(spec, graphs: dict) -> tuple[dict, dict]:
    """Each model's DVFS steps on the preset, and the 300 s latency against R_ja."""
    reports, rows = {}, {}
    for name, g in graphs.items():
        at = {}
        for s in throttled_specs(spec):
            sched = lower(g, s)
            at[s.array.clock_hz] = (sched.latency_s, sched.energy_j)
            print(f"  {name} @ {s.array.clock_hz / 1e6:.2f} MHz: {sched.latency_s * 1e3:.3f} ms, "
                  f"{sched.energy_j * 1e3:.3f} mJ", flush=True)
        rep = sustained(spec, PRACTITIONER[2], lambda s, at=at: at[s.array.clock_hz])
        reports[name] = rep
        rows[name] = {}
        for r in R_SWEEP:
            th = dataclasses.replace(spec.thermal, junction_to_ambient_k_per_w=r)
            x = sustained(spec.with_fields({"thermal.junction_to_ambient_k_per_w": r}),
                          PRACTITIONER[2], lambda s, at=at: at[s.array.clock_hz])
            rows[name][r] = x
            assert x.thermal == th
    return reports, rows


def thermal_plot(path: Path, reports: dict, rows: dict, spec) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 4.2))
    ax_t, ax_l, ax_r = fig.subplots(1, 3)
    name = "DenseNet-121"
    t = np.linspace(0.0, 600.0, 1201)
    for r, style in ((30.0, "-"), (60.0, "--"), (80.0, ":")):  # the preset, two that throttle
        s = rows[name][r].at(t)
        label = f"R_ja {r:g} K/W" + (" (preset)" if r == spec.thermal.junction_to_ambient_k_per_w
                                     else "")
        ax_t.plot(t, s.temperature_c, style, label=label)
        ax_l.plot(t, s.latency_s * 1e3, style, label=label)
    for th in spec.thermal.dvfs_thresholds_c:
        ax_t.axhline(th, color="grey", lw=0.6)
    ax_t.set(xlabel="seconds of continuous inference", ylabel="junction temperature (C)",
             title=f"{name} on coral_devboard")
    ax_l.set(xlabel="seconds of continuous inference",
             ylabel="latency (ms; a limit cycle's mean)", title="latency from cold")
    ax_l.axvline(PRACTITIONER[2], color="grey", lw=0.6)
    for ax in (ax_t, ax_l):
        ax.legend(fontsize=8)
    for model, byr in rows.items():
        ax_r.plot(R_SWEEP, [byr[r].state.latency_s / byr[r].latency_s[0] for r in R_SWEEP],
                  "o-", label=model)
    ax_r.axhline(PRACTITIONER[1] / PRACTITIONER[0], color="k", ls="--", lw=0.8,
                 label="practitioner: 18 / 12 ms")
    ax_r.axvline(spec.thermal.junction_to_ambient_k_per_w, color="grey", lw=0.6)
    ax_r.set(xlabel="R_ja (K/W; preset 30, assumed)", ylabel="latency after 300 s / cold",
             title="slowdown after 5 minutes")
    ax_r.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def pipeline_part(spec, graphs: dict) -> dict:
    """The detector (YOLOv8n + NMS) and the camera classifier (DenseNet-121 + top-5).

    Zero-copy: the Dev Board's Edge TPU reads its input from, and writes its output to, host
    memory across PCIe, which the preset models as its DRAM (``memory.dram_bytes_per_s`` is
    the link's rate), so the cost program's first and last layers already move those bytes;
    a copy stage would count them twice."""
    out = {}
    yolo_spec = spec.with_fields({"ops.supported": [*spec.ops.supported, "Expand"]})
    det = graphs["YOLOv8n"]
    sched = lower(det, yolo_spec)
    for cand in (300, 1000, 2000, 8400):
        stages = [parse_host_stage(x) for x in (
            "resize:from=1920x1080", "normalize",
            f"nms:boxes=8400:classes=80:candidates={cand}")]
        out[f"YOLOv8n, NMS of {cand} candidates"] = pipeline_lowering(
            det, yolo_spec, sched, stages, zero_copy=True)
    cam = graphs["DenseNet-121"]
    sched = lower(cam, spec)
    stages = [parse_host_stage(x) for x in ("resize:from=1920x1080", "normalize", "layout",
                                            "topk:k=5")]
    out["DenseNet-121 camera"] = pipeline_lowering(cam, spec, sched, stages, zero_copy=True)
    return out


def pipeline_plot(path: Path, pipes: dict) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 4.6))
    ax_b, ax_g = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.1, 1.4]})
    names = [k for k in pipes if k.startswith("YOLOv8n")]
    # zero-copy stages take no time: left out of the bars
    stage_names = [s.name for s in pipes[names[0]].stages if s.bound != "zero_copy"]
    left = np.zeros(len(names))
    for sn in stage_names:
        w = np.array([next(s.seconds for s in pipes[n].stages if s.name == sn) * 1e3
                      for n in names])
        ax_b.barh(range(len(names)), w, left=left, label=sn)
        left += w
    xmax = 60.0
    for i, total in enumerate(left):
        if total > xmax:
            ax_b.text(xmax * 0.98, i, f"{total:,.0f} ms ->", ha="right", va="center",
                      color="white", fontsize=8)
    ax_b.set_xlim(0, xmax)
    ax_b.set_yticks(range(len(names)), [n.replace("YOLOv8n, ", "") for n in names])
    ax_b.set(xlabel="ms per frame (synchronous: the stages in turn)",
             title="YOLOv8n 640x640, coral_devboard: a frame's stages")
    ax_b.legend(fontsize=8, loc="lower right")
    cam = pipes["DenseNet-121 camera"]
    cam = dataclasses.replace(cam, stages=tuple(s for s in cam.stages if s.bound != "zero_copy"))
    frames = 4
    colors = {s.name: f"C{i}" for i, s in enumerate(cam.stages)}
    for row, overlap in ((1, False), (0, True)):
        t0 = 0.0
        period = cam.bounding_stage.seconds if overlap else cam.latency_s
        for f in range(frames):
            t = t0 + f * period
            for s in cam.stages:
                y = row * (len(cam.stages) + 1) + list(colors).index(s.name)
                ax_g.barh(y, s.seconds * 1e3, left=t * 1e3, color=colors[s.name],
                          edgecolor="k", lw=0.3)
                ax_g.text((t + s.seconds / 2) * 1e3, y, str(f + 1), ha="center", va="center",
                          fontsize=6)
                t += s.seconds
    ticks = [row * (len(cam.stages) + 1) + i for row in (0, 1) for i in range(len(cam.stages))]
    labels = [f"{'async' if row == 0 else 'sync'}: {s.name}" for row in (0, 1)
              for s in cam.stages]
    ax_g.set_yticks(ticks, labels, fontsize=7)
    ax_g.invert_yaxis()
    ax_g.set(xlabel="ms", title=f"camera, DenseNet-121, batch 1: {frames} frames, "
             "sync vs double-buffered")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="realities_out")
    args = ap.parse_args()
    spec = load_npu_spec("coral_devboard")
    print("importing models", flush=True)
    graphs = {"DenseNet-121": import_onnx_for_lowering(light("densenet121"), None, None),
              "Inception v2": import_onnx_for_lowering(light("inception_v2"), None, None),
              "YOLOv8n": yolov8n_graph()}
    thermal_graphs = {k: graphs[k] for k in ("DenseNet-121", "Inception v2")}
    reports, rows = thermal_part(spec, thermal_graphs)
    pipes = pipeline_part(spec, graphs)
    summary: dict = {"thermal": {}, "pipeline": {}}
    print("\n| model | step | clock MHz | latency ms | energy mJ | power W | steady C |")
    print("|---|---|---|---|---|---|---|")
    for name, rep in reports.items():
        for i, (f, lat, e, p, c) in enumerate(zip(rep.clocks_hz, rep.latency_s, rep.energy_j,
                                                   rep.power_w, rep.steady_temperature_c)):
            print(f"| {name} | {i} | {f / 1e6:.2f} | {lat * 1e3:.2f} | {e * 1e3:.2f} | {p:.2f} | "
                  f"{c:.1f} |")
        summary["thermal"][name] = rep.to_dict()
    print("\n| model | R_ja K/W | first throttle s | after 300 s ms | x cold | steady ms | "
          "steady C | end state |")
    print("|---|---|---|---|---|---|---|---|")
    for name, byr in rows.items():
        summary["thermal"][name]["r_sweep"] = {}
        for r, x in byr.items():
            s = x.state
            end = (f"cycle {s.steady_step - 1}-{s.steady_step}" if s.limit_cycle
                   else f"step {s.steady_step}")
            first = "never" if s.first_throttle_s == float("inf") else f"{s.first_throttle_s:.0f}"
            print(f"| {name} | {r:g} | {first} | {s.latency_s * 1e3:.2f} | "
                  f"{s.latency_s / x.latency_s[0]:.2f} | {s.steady_latency_s * 1e3:.2f} | "
                  f"{s.steady_temperature_c:.1f} | {end} |")
            summary["thermal"][name]["r_sweep"][str(r)] = x.to_dict()
    print("\n| pipeline | stages ms | end to end ms | sync frames/s | async frames/s | "
          "bound |")
    print("|---|---|---|---|---|---|")
    for name, p in pipes.items():
        st = ", ".join(f"{s.name} {s.seconds * 1e3:.2f}" for s in p.stages)
        print(f"| {name} | {st} | {p.latency_s * 1e3:.2f} | {p.throughput_fps(False):.1f} | "
              f"{p.throughput_fps(True):.1f} | {p.bounding_stage.name} |")
        summary["pipeline"][name] = p.to_dict()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for fn, plot in (("realities_thermal.png", lambda p: thermal_plot(p, reports, rows, spec)),
                     ("realities_pipeline.png", lambda p: pipeline_plot(p, pipes))):
        tmp = out / f".{fn}.tmp.png"
        plot(tmp)
        os.replace(tmp, out / fn)
    atomic_write_text(out / "realities.json", json.dumps(summary, indent=1) + "\n")
    print(f"wrote {args.out}/realities_thermal.png, realities_pipeline.png, realities.json")


if __name__ == "__main__":
    main()
