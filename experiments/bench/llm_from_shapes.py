"""Benchmark (issue 30 item 3, issue 31 item 4): ``npujax lower decoder:...`` as a user runs it,
CPU seconds and peak RSS of the whole command (``/usr/bin/time -v``), with the compiled-program
cache cold (a fresh ``NPUJAX_COMPILE_CACHE``) and warm (the same folder again), for several
checkouts interleaved in one run; then the phases of one in-process lowering of this checkout.

Usage: python experiments/bench/llm_from_shapes.py [--trees /work/main,.] [--repeats 2]
           [--models qwen2.5-0.5b,llama-3.1-8b,experiments/llm_configs/mixtral-8x7b.json]
           [--phases decode,prefill] [--npu edge_16x16]

With two trees it prints the medians side by side and their ratios, and the load average at
the start and the end.

Targets: <= 1 s of CPU and <= 300 MB for a 0.5 B model, <= 2 s and <= 400 MB for 8 B.
A checkout that does not know a model (an old one and a config file) is reported as such.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(tree: str, model: str, cache: str, phase: str = "decode",
        npu: str = "edge_16x16") -> tuple[float, float] | None:
    """(CPU s, peak RSS MB) of one ``npujax lower`` step, or None if it failed."""
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve()), "NPUJAX_COMPILE_CACHE": cache}
    if model.endswith(".json"):
        model = str(Path(model).resolve())
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "npujax", "lower", f"decoder:{model}",
           "--phase", phase, *(["--kv-len", "1024"] if phase == "decode" else []),
           "--npu", npu, "--no-progress"]
    # (run outside any checkout: ``python -m`` puts the working folder first on sys.path)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=cache)
    if r.returncode:
        return None
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", r.stderr).group(1))
    sys_ = float(re.search(r"System time \(seconds\): ([\d.]+)", r.stderr).group(1))
    rss = float(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    return user + sys_, rss / 1024


def phases(model: str, npu: str = "edge_16x16") -> None:
    """Where one in-process lowering of this checkout spends its CPU time."""
    t = time.process_time()
    from npujax.cli import compile_cache

    compile_cache()
    from npujax.hw import load_npu_spec
    from npujax.models.decoders import decoder_graph, decoder_precision
    from npujax.models.hf_config import load_decoder
    from npujax.plan import workloads
    from npujax.plan.lower import lower_dataflows

    spec = load_npu_spec(npu)
    marks = [("imports", time.process_time() - t)]
    t = time.process_time()
    cfg = load_decoder(model)
    g = decoder_graph(cfg, phase="decode", kv_len=1024)
    marks.append((f"config + graph ({len(g.nodes)} nodes)", time.process_time() - t))
    t = time.process_time()
    workloads(g, spec)
    marks.append(("workloads", time.process_time() - t))
    t = time.process_time()
    lower_dataflows(g, spec, decoder_precision(g, 8, 8, 8))
    marks.append(("cost program (trace + compile or cache load) and report",
                  time.process_time() - t))
    print(f"phases of {model} (this checkout, in process):")
    for what, s in marks:
        print(f"  {what:<58} {s:6.2f} s CPU")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", default="/work/main,.")
    ap.add_argument("--models", default="qwen2.5-0.5b,llama-3.1-8b,"
                                        "experiments/llm_configs/mixtral-8x7b.json")
    ap.add_argument("--phases", default="decode,prefill", help="decoder steps to lower")
    ap.add_argument("--npu", default="edge_16x16", help="preset (default: the command's)")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    trees, models, steps = a.trees.split(","), a.models.split(","), a.phases.split(",")
    print(f"load average at start: {os.getloadavg()}; --npu {a.npu}")
    print(f"{'checkout':<16} {'model':<24} {'phase':<8} {'cache':<5} {'CPU s':>6} "
          f"{'peak MB':>8}")
    got: dict[tuple[str, str, str, str], list[tuple[float, float]]] = {}
    for model in models:
        for step in steps:
            for _ in range(a.repeats):
                for tree in trees:  # interleaved: the machine's load falls on every tree alike
                    with tempfile.TemporaryDirectory() as cache:
                        for state in ("cold", "warm"):
                            r = run(tree, model, cache, step, a.npu)
                            shown = (f"{r[0]:6.2f} {r[1]:8.0f}" if r
                                     else "  (this checkout cannot lower it)")
                            print(f"{Path(tree).resolve().name:<16} {Path(model).name:<24} "
                                  f"{step:<8} {state:<5} {shown}", flush=True)
                            if r:
                                got.setdefault((tree, model, step, state), []).append(r)
    print(f"load average at end: {os.getloadavg()}")
    if len(trees) == 2:
        before, after = trees
        print(f"medians, {Path(before).resolve().name} -> {Path(after).resolve().name} "
              "(CPU s; peak MB) and the ratio before/after:")
        for model in models:
            for step in steps:
                for state in ("cold", "warm"):
                    b, n = (got.get((t, model, step, state)) for t in (before, after))
                    if not b or not n:
                        continue
                    bc, nc = (statistics.median(x[0] for x in v) for v in (b, n))
                    bm, nm = (statistics.median(x[1] for x in v) for v in (b, n))
                    print(f"  {Path(model).name:<24} {step:<8} {state:<5} {bc:5.2f} -> "
                          f"{nc:5.2f} s ({bc / nc:4.2f}x); {bm:4.0f} -> {nm:4.0f} MB "
                          f"({bm / nm:4.2f}x)")
    phases(models[0], a.npu)


if __name__ == "__main__":
    main()
