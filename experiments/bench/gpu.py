"""The GPU check of issue 30 (target 7), one prepared script: run it on a machine with a GPU.

Usage:  python experiments/bench/gpu.py --out DIR [--model zoo:ppocr_cls | MODEL.onnx]
            [--seconds 10] [--smoke]

It prints, and writes to ``DIR`` (``gpu.json``, ``gpu.png``, ``cpu_reference.npz``):

  (1) the devices JAX sees (the default backend is the accelerator; the CPU is the reference);
  (2) the same sweep results on the CPU and on the accelerator: ``--configs`` configurations
      (default 4096, drawn with seed 0) of the README's grid (array.rows x array.cols x
      memory.dram_bytes_per_s x dataflow ws,os,is x bits 4,8, widened to 10 values per numeric
      axis) evaluated by ``npujax.explore.evaluate_configs`` on the CPU first (written to
      ``cpu_reference.npz``) and then on the accelerator; per column, how many values differ
      and by how many ulps at most (the goal: none);
  (3) the sweep program's steady throughput on the accelerator, in layer evaluations per second
      of wall time (configurations x layers / s), for batches of 2^14 .. 2^20 configurations
      (stopping at the first that does not fit), each called for ``--seconds``; the goal is
      >= 1e10 layer evaluations/s;
  (4) the JAX forward of the model (``npujax.execute`` jitted with the weights as arguments,
      and :func:`npujax.ir.execute.inference`, the weights built into the program, of the
      optimized graph as the CPU benchmark runs it; float32, batch 1 and 32) against
      onnxruntime's CUDA execution provider when onnxruntime-gpu is importable (skipped, with
      the reason, when it is not).

``--smoke`` runs every part at tiny sizes on whatever backend there is (a CPU here): 64
configurations, batches of 2^8 and 2^10, half a second each, onnxruntime's CPU provider in place
of CUDA's. The model must be readable on the machine: ``zoo:ppocr_cls`` is read from npujax's
cache (``$NPUJAX_CACHE``, default ``~/.cache/npujax``), which a machine without network needs
copied in (docs/results/gpu.md says how).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

GRID = {"array.rows": [4, 8, 12, 16, 24, 32, 48, 64, 96, 128],
        "array.cols": [4, 8, 12, 16, 24, 32, 48, 64, 96, 128],
        "memory.dram_bytes_per_s": [float(x) * 1e9 for x in (1.6, 3.2, 4.8, 6.4, 9.6, 12.8, 19.2,
                                                             25.6, 51.2, 102.4)],
        "dataflow": ["ws", "os", "is"], "bits": [4, 8]}


def load_graph(model: str):
    """The optimized graph of ``zoo:NAME`` or an ONNX file, and the ONNX path."""
    from npujax.frontends.onnx import parse_input_shapes
    from npujax.models.zoo import MODELS, fetch_model
    from npujax.workflows.lowering import import_onnx_for_lowering

    if model.startswith("zoo:"):
        z = MODELS[model[4:]]
        path = str(fetch_model(model[4:]))
        shapes = parse_input_shapes([f"{z.input_name}={','.join(map(str, z.input_shape))}"])
    else:
        path, shapes = model, None
    return import_onnx_for_lowering(path, shapes, None), path


def ulps(a: np.ndarray, b: np.ndarray) -> int:
    """The largest distance in units in the last place between two float64 (or int64) arrays."""
    if a.dtype.kind != "f":
        return int(np.max(np.abs(a.astype(np.int64) - b.astype(np.int64)), initial=0))
    ia, ib = a.view(np.int64), b.view(np.int64)
    ia = np.where(ia < 0, np.int64(-(2**63)) - ia, ia)  # monotone in the float's value
    ib = np.where(ib < 0, np.int64(-(2**63)) - ib, ib)
    return int(np.max(np.abs(ia - ib), initial=0))


def same_results(graph, base, grid, configs, cpu, accel, out: Path) -> dict:
    """Part 2: the sweep's columns on the CPU (saved) and on the accelerator, compared."""
    from npujax.explore.sweep import evaluate_configs

    ref = evaluate_configs(graph, base, grid, configs, devices=cpu)
    np.savez(out / "cpu_reference.npz", configs=configs, **ref)
    got = evaluate_configs(graph, base, grid, configs, devices=accel)
    cols = {}
    for k, v in ref.items():
        n = int(np.sum(v != got[k]))
        cols[k] = {"differing": n, "max_ulps": ulps(v, got[k]) if n else 0}
    return {"configurations": int(len(configs)), "columns": cols,
            "identical": all(c["differing"] == 0 for c in cols.values())}


def throughput(layers, chains, base, accel, batches, seconds: float) -> dict[str, float]:
    """Part 3: the compiled sweep program alone, inputs on the device, called for ``seconds``
    per batch size; layer evaluations per wall second."""
    import importlib

    import jax

    from npujax._exact import exact
    from npujax.hw import fields
    from npujax.systolic.dataflow import get_dataflow

    sw = importlib.import_module("npujax.explore.sweep")
    dfs = tuple(get_dataflow(d).name for d in GRID["dataflow"])
    mesh = sw._mesh(accel)
    program = exact(sw._program(tuple(layers), dfs, mesh, tuple(chains)))
    rng = np.random.default_rng(0)
    out = {}
    for n in batches:
        changes = {k: rng.choice(GRID[k], n) for k in ("array.rows", "array.cols",
                                                      "memory.dram_bytes_per_s")}
        stacked = fields.stack(base, changes, n)
        bits = rng.choice(np.asarray(GRID["bits"], np.float64), n)
        index = rng.integers(0, len(dfs), n).astype(np.int32)
        try:
            with jax.enable_x64(True):
                sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("config"))
                args = jax.device_put((stacked, bits, index), sharding)
                jax.block_until_ready(program(*args))  # compile and warm up
                calls, t = 0, time.perf_counter()
                while time.perf_counter() - t < seconds or calls < 2:
                    jax.block_until_ready(program(*args))
                    calls += 1
                wall = time.perf_counter() - t
        except jax.errors.JaxRuntimeError as e:  # out of memory: the larger batches too
            print(f"    batch {n}: stopped ({str(e).splitlines()[0][:120]})")
            break
        out[str(n)] = calls * n * len(layers) / wall
        print(f"    batch {n:8d}: {out[str(n)]:.3g} layer evaluations/s ({calls} calls)",
              flush=True)
    return out


def forward(graph_path: str, smoke: bool, seconds: float) -> dict:
    """Part 4: the JAX forward against onnxruntime (CUDA; the CPU provider under --smoke)."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        return {"skipped": f"onnxruntime is not importable ({e})"}
    providers = ort.get_available_providers()
    provider = "CUDAExecutionProvider"
    if provider not in providers:
        if not smoke:
            return {"skipped": f"onnxruntime has no CUDAExecutionProvider ({providers}); "
                               "pip install onnxruntime-gpu"}
        provider = "CPUExecutionProvider"
    import jax
    import jax.numpy as jnp

    from npujax import execute
    from npujax.frontends.onnx import from_onnx
    from npujax.ir.execute import inference
    from npujax.ir.passes import optimize

    out: dict = {"onnxruntime provider": provider}
    sess = ort.InferenceSession(graph_path, providers=[provider])
    inp = sess.get_inputs()[0]
    for batch in (1, 32):
        shape = [batch] + [d if isinstance(d, int) else 1 for d in inp.shape[1:]]
        if any(not isinstance(d, int) for d in inp.shape[2:]):
            shape = [batch, 3, 48, 192]
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        graph, params = from_onnx(graph_path, {inp.name: tuple(shape)})
        f = jax.jit(lambda p, v, g=graph: execute(g, p, v))
        params = jax.device_put(params)
        xs = jax.device_put(jnp.asarray(x))
        y = np.asarray(jax.block_until_ready(f(params, xs)))
        ref = sess.run(None, {inp.name: x})[0]
        row = {"max_abs_diff": float(np.max(np.abs(np.asarray(y).reshape(ref.shape) - ref)))}
        row["jax ms"] = _ms_per_call(lambda f=f, p=params, v=xs: jax.block_until_ready(f(p, v)),
                                     seconds)
        inf = inference(*optimize(graph, params))
        y_inf = np.asarray(jax.block_until_ready(inf(xs)))
        row["inference max_abs_diff"] = float(np.max(np.abs(y_inf.reshape(ref.shape) - ref)))
        row["jax inference ms"] = _ms_per_call(
            lambda f=inf, v=xs: jax.block_until_ready(f(v)), seconds)
        row["onnxruntime ms"] = _ms_per_call(lambda x=x: sess.run(None, {inp.name: x}), seconds)
        row["jax / onnxruntime"] = row["jax ms"] / row["onnxruntime ms"]
        row["jax inference / onnxruntime"] = row["jax inference ms"] / row["onnxruntime ms"]
        out[f"batch {batch}"] = row
        print(f"    batch {batch}: JAX {row['jax ms']:.3f} ms (inference "
              f"{row['jax inference ms']:.3f} ms), onnxruntime ({provider}) "
              f"{row['onnxruntime ms']:.3f} ms, ratio {row['jax / onnxruntime']:.2f} "
              f"(inference {row['jax inference / onnxruntime']:.2f}), max |diff| "
              f"{max(row['max_abs_diff'], row['inference max_abs_diff']):.2e}", flush=True)
    return out


def _ms_per_call(call, seconds: float) -> float:
    """Milliseconds of wall time per call, after one warm-up call, over ``seconds`` (>= 3)."""
    call()
    calls, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds or calls < 3:
        call()
        calls += 1
    return 1e3 * (time.perf_counter() - t) / calls


def plot(result: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    rates = result["throughput"]
    if rates:
        ax.plot([int(k) for k in rates], list(rates.values()), "o-",
                label=f"sweep program on {result['devices']['accelerator']}")
    ax.axhline(1e10, color="C3", ls="--", label="goal 1e10")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("configurations per call")
    ax.set_ylabel("layer evaluations / s (wall)")
    ax.set_title(f"{result['model']}: {result['layers']} layers, 3 dataflows"
                 + (" (smoke)" if result["smoke"] else ""))
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu.json, gpu.png and the "
                    "CPU reference")
    ap.add_argument("--model", default="zoo:ppocr_cls", help="zoo:NAME or an .onnx file")
    ap.add_argument("--configs", type=int, default=4096, help="configurations compared")
    ap.add_argument("--seconds", type=float, default=10.0, help="timing per batch size")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, any backend")
    args = ap.parse_args()
    import jax

    from npujax.explore.grid import Grid, configurations
    from npujax.hw import load_npu_spec
    from npujax.plan.program import network

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    accel, cpu = jax.devices(), jax.devices("cpu")
    if accel[0].platform == "cpu" and not args.smoke:
        raise SystemExit("no accelerator: JAX's default backend is the CPU (install a GPU "
                         "jaxlib, e.g. pip install 'jax[cuda12]'), or pass --smoke")
    seconds = 0.5 if args.smoke else args.seconds
    n_configs = 64 if args.smoke else args.configs
    batches = [1 << 8, 1 << 10] if args.smoke else [1 << k for k in (14, 16, 18, 20)]
    result: dict = {"smoke": args.smoke, "model": args.model, "load_before": os.getloadavg(),
                    "jax": jax.__version__,
                    "devices": {"accelerator": f"{len(accel)} x {accel[0].device_kind}",
                                "cpu": f"{len(cpu)} x {cpu[0].device_kind}"}}
    print(f"(1) devices: {result['devices']} (jax {jax.__version__}); load average "
          f"{result['load_before'][0]:.1f}", flush=True)
    graph, path = load_graph(args.model)
    base = load_npu_spec("edge_16x16")
    grid = Grid.build(GRID, base)
    layers, chains = network(graph, base)
    result["layers"] = len(layers)
    configs = configurations(grid, min(n_configs, grid.size), "random", 0)
    t = time.perf_counter()
    result["same_results"] = same_results(graph, base, grid, configs, cpu, accel, out)
    bad = {k: v for k, v in result["same_results"]["columns"].items() if v["differing"]}
    print(f"(2) {len(configs)} configurations, CPU vs {result['devices']['accelerator']}: "
          + ("identical, bit for bit" if not bad else f"{len(bad)} columns differ: {bad}")
          + f" ({time.perf_counter() - t:.1f} s)", flush=True)
    print("(3) the sweep program's steady throughput (goal >= 1e10 layer evaluations/s)")
    result["throughput"] = throughput(layers, chains, base, accel, batches, seconds)
    print("(4) JAX forward against onnxruntime")
    result["forward"] = forward(path, args.smoke, seconds)
    if "skipped" in result["forward"]:
        print(f"    skipped: {result['forward']['skipped']}")
    result["load_after"] = os.getloadavg()
    (out / "gpu.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out / "gpu.png")
    print(f"wrote {out / 'gpu.json'}, {out / 'gpu.png'}, {out / 'cpu_reference.npz'}")


if __name__ == "__main__":
    main()
