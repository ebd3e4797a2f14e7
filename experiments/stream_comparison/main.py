"""npujax vs Stream (stream-dse) on the same models and a matched multi-core accelerator.

Usage:
    python experiments/stream_comparison/main.py --stream-python /path/to/py3.12/bin/python

Stream (Symons et al., "Stream: design space exploration of layer-fused DNNs on heterogeneous
dataflow accelerators", IEEE TC 2024) schedules layer-fused DNNs on multi-core accelerators. Its
2.x releases need Python >= 3.12, so it runs in its own interpreter (``--stream-python``, with
``pip install stream-dse``) through ``stream_side.py``; without it (or with ``--stream-json`` from
an earlier run) only npujax's side is computed and the table says Stream was not run.

Hardware: Stream's example ``tpu_like_quad_core`` and npujax's field-by-field description of it
(``tpu_like_quad_core.toml`` here). Models: small float ONNX models of operators Stream's ONNX
frontend parses (``models.py``; Stream 2.1.1 has no parser for ``Clip``, which the PP-OCR models
use for hard-swish, so those cannot run through it). Stream sizes the tensors of a float model at
32 bits while its cores compute int8; npujax is run both at int8 and "as Stream sees it" (the
same element count at 4 bytes: DRAM bandwidth and the input and weight SRAM divided by 4; the
output SRAM holds int32 partial sums in both).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from npujax.frontends.onnx import from_onnx
from npujax.hw import load_npu_spec
from npujax.ir.passes import optimize
from npujax.plan import CostMode, core_schedules, lower, program_cost, workloads

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from models import conv_chain, resnet_blocks  # noqa: E402

MODELS = {"conv_chain_64": conv_chain, "resnet_blocks_56": resnet_blocks}


def _best(fn, repeat=5):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def run_stream(python: str, paths: list[str], out: Path) -> dict:
    hw = subprocess.run([python, "-c", "import os, stream; print(os.path.join(os.path.dirname("
                         "stream.__file__), 'inputs/examples/hardware/tpu_like_quad_core.yaml'))"],
                        capture_output=True, text=True, check=True).stdout.strip()
    r = subprocess.run([python, str(HERE / "stream_side.py"), "--hardware", hw, "--out",
                        str(out), *paths], capture_output=True, text=True)
    if r.returncode:
        print(r.stderr[-2000:], file=sys.stderr)
        return {}
    return json.loads(out.read_text())


def stream_result(stream: dict, path: str) -> dict | None:
    """Stream's figures for the model at ``path``: results are keyed by the model's file name
    (``stream_side.py`` writes them so, and the committed results are so), which does not
    depend on ``--work``; a full path key (older runs) is accepted too."""
    return stream.get(Path(path).name) or stream.get(path)


def npujax_side(path: str) -> dict:
    graph = optimize(*from_onnx(path))[0]
    int8 = load_npu_spec(HERE / "tpu_like_quad_core.toml")
    m = int8.memory
    f32 = int8.with_fields({"memory.dram_bytes_per_s": m.dram_bytes_per_s / 4,
                            "memory.ifmap_sram_bytes": m.ifmap_sram_bytes // 4,
                            "memory.filter_sram_bytes": m.filter_sram_bytes // 4})
    res = {}
    for tag, spec in (("int8", int8), ("f32-matched", f32)):
        s = lower(graph, spec)
        cs = core_schedules(graph, spec)
        res[tag] = {"layer_split_cycles": s.latency_cycles,
                    "pipeline_cycles": cs["pipeline"].latency_s * spec.array.clock_hz,
                    "pipeline_period_cycles": cs["pipeline"].period_s * spec.array.clock_hz,
                    "dram_bytes": s.dram_bytes, "unfused_dram_bytes": s.unfused_dram_bytes,
                    "macs": s.macs}
    res["lower_s"] = _best(lambda: lower(graph, int8))
    layers = tuple(workloads(graph, int8))
    n = len(layers)
    f = jax.jit(jax.vmap(lambda h: jnp.sum(program_cost(  # int8 fuses layers: the placement
        layers, h, jnp.full(n, 8.0), jnp.full(n, 8.0),
        mode=CostMode(energy=False)).costs.latency_cycles)))
    specs = jax.tree.map(lambda v: jnp.broadcast_to(jnp.asarray(v), (1000,)), int8)
    f(specs).block_until_ready()
    res["vmapped_per_schedule_s"] = _best(lambda: f(specs).block_until_ready()) / 1000
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stream-python", help="a Python with stream-dse installed")
    ap.add_argument("--stream-json", help="Stream results from an earlier run")
    ap.add_argument("--work", default="/tmp/npujax_stream_cmp")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    paths = {name: str(build(str(work / f"{name}.onnx"))) for name, build in MODELS.items()}
    stream: dict = {}
    if args.stream_json:
        stream = json.loads(Path(args.stream_json).read_text())
    elif args.stream_python:
        stream = run_stream(args.stream_python, list(paths.values()), work / "stream.json")
    print("| model | MACs | tool | latency (cycles) | DRAM bytes | s per evaluated schedule |")
    print("|---|---|---|---|---|---|")
    for name, path in paths.items():
        ours = npujax_side(path)
        macs = ours["int8"]["macs"]
        st = stream_result(stream, path)
        if st:
            print(f"| {name} | {macs:,} | Stream 2.1.1 (f32 tensors) | {st['cycles']:,.0f} | "
                  f"{st['offchip_bytes']:,.0f} | {st['wall_s']:.1f} |")
        else:
            print(f"| {name} | {macs:,} | Stream | not run (stream-dse not installed; see "
                  "--stream-python) | | |")
        for tag in ("f32-matched", "int8"):
            o = ours[tag]
            print(f"| {name} | {macs:,} | npujax {tag}: layer-split / pipeline (period) | "
                  f"{o['layer_split_cycles']:,.0f} / {o['pipeline_cycles']:,.0f} "
                  f"({o['pipeline_period_cycles']:,.0f}) | {o['dram_bytes']:,.0f} "
                  f"(unfused {o['unfused_dram_bytes']:,.0f}) | {ours['lower_s']:.3f} lower, "
                  f"{ours['vmapped_per_schedule_s']:.1e} vmapped |")


if __name__ == "__main__":
    main()
