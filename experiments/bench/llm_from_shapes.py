"""Benchmark (issue 30 item 3, issue 31 item 4): ``npujax lower decoder:...`` as a user runs it,
CPU seconds and peak RSS of the whole command (``/usr/bin/time -v``), with the compiled-program
cache cold (a fresh ``NPUJAX_COMPILE_CACHE``) and warm (the same folder again), for several
checkouts interleaved in one run; then the phases of one in-process lowering of this checkout.

Usage: python experiments/bench/llm_from_shapes.py [--trees /work/main,.] [--repeats 2]
           [--models qwen2.5-0.5b,llama-3.1-8b,experiments/llm_configs/mixtral-8x7b.json]
           [--phases decode,prefill] [--npu edge_16x16] [--case readme] [--case "ARGS"]
       python experiments/bench/llm_from_shapes.py --program-size [--models qwen2.5-0.5b]

``--case`` adds a command of its own (repeatable): ``readme`` is the README's decode step
(Llama 3.1 8B, a batch of 8 with 512-4096 cached positions, int4 weights in groups of 128, on
``datacenter_128x128``: attention chains, so the program of the layer list), anything else the
arguments after ``npujax lower``.

With two trees it prints the medians side by side and their ratios, and the load average at
the start and the end. Then, for each tree, where one command's CPU time and peak RSS go
(``--phases-of``, default the first model's decode step; a fresh process per tree, cold then
warm, interleaved): the imports, the graph and workloads, the cost program (tracing and
lowering it, compiling it or loading it from the cache, running it), the reports and the
printing, each phase's CPU seconds and the peak RSS when it ends (``ru_maxrss``: the phase in
which it rises holds the peak).

Targets: <= 1 s of CPU and <= 300 MB for a 0.5 B model, <= 2 s and <= 400 MB for 8 B.
A checkout that does not know a model (an old one and a config file) is reported as such.

Every checkout is measured as installed, with its bytecode written first
(``experiments/bench/_bytecode.py``: a shell with ``PYTHONDONTWRITEBYTECODE=1`` would otherwise
compile npujax's modules in every process, 0.15-0.3 CPU s that no user pays).
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

#: ``--case readme``: the README's decode step of an LLM from its config.
README_DECODE = ("decoder:npujax/models/configs/llama-3.1-8b.json --phase decode --batch 8 "
                 "--kv-len 512,512,1024,1024,2048,2048,4096,4096 --npu datacenter_128x128 "
                 "--weight-bits 4 --weight-group-size 128")


def lower_args(model: str, phase: str = "decode", npu: str = "edge_16x16") -> list[str]:
    """The arguments after ``npujax lower`` of one decoder step (paths made absolute)."""
    if model.endswith(".json"):
        model = str(Path(model).resolve())
    return [f"decoder:{model}", "--phase", phase,
            *(["--kv-len", "1024"] if phase == "decode" else []), "--npu", npu]


#: The checkout of this script (:data:`README_DECODE`'s config path is relative to it).
ROOT = Path(__file__).resolve().parents[2]


def case_args(case: str) -> list[str]:
    """``--case``'s arguments (``readme``: :data:`README_DECODE`, its config in this
    checkout), config paths absolute."""
    args = (README_DECODE if case == "readme" else case).split()
    base = ROOT if case == "readme" else Path.cwd()
    return [f"decoder:{(base / a[8:]).resolve()}" if a.startswith("decoder:")
            and a.endswith(".json") else a for a in args]


def run(tree: str, args: list[str], cache: str) -> tuple[float, float] | None:
    """(CPU s, peak RSS MB) of ``npujax lower ARGS``, or None if it failed."""
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve()), "NPUJAX_COMPILE_CACHE": cache}
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "npujax", "lower", *args,
           "--no-progress"]
    # (run outside any checkout: ``python -m`` puts the working folder first on sys.path)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=cache)
    if r.returncode:
        return None
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", r.stderr).group(1))
    sys_ = float(re.search(r"System time \(seconds\): ([\d.]+)", r.stderr).group(1))
    rss = float(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    return user + sys_, rss / 1024


#: The phases of one command (:func:`child`), by the function that starts each; a phase ends
#: where the next starts.
PHASE_STARTS = (("graph and workloads", "npujax.models.serving", "lower_decoder"),
                ("cost program", "npujax.plan.lower", "_costs_program"),
                ("reports", "npujax.plan.lower", "_schedule"),
                ("printing", "npujax.report.lowering", "print_lowering"))


def child(args: list[str]) -> None:
    """Run ``npujax lower ARGS`` in this process as the command does (the CLI's compile cache;
    its malloc arena cap where the checkout has one) and print, as JSON, each phase's CPU
    seconds and the peak RSS (MB) when it ended; the cost program split by JAX's monitoring
    events into tracing/lowering and compiling (or loading from the cache)."""
    import contextlib
    import importlib
    import io
    import json
    import resource

    def peak() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    # (the phase that starts at a mark, CPU s, peak MB); a phase ends at the next mark
    marks = [("imports", time.process_time(), peak())]
    import npujax.cli as cli

    if hasattr(cli, "_few_malloc_arenas"):
        cli._few_malloc_arenas()
    for module in ("npujax.hw", "npujax.models.hf_config", "npujax.models.serving",
                   "npujax.report.lowering", "npujax.plan.lower", "npujax.models.decoders"):
        importlib.import_module(module)
    marks.append(("parsing and checks", time.process_time(), peak()))
    for label, module, name in PHASE_STARTS:
        mod = importlib.import_module(module)
        fn = getattr(mod, name)
        started: list[bool] = []

        def wrapped(*a, _fn=fn, _label=label, _started=started, **k):
            if not _started:  # a phase starts once (the first call)
                _started.append(True)
                marks.append((_label, time.process_time(), peak()))
            return _fn(*a, **k)
        setattr(mod, name, wrapped)
    from jax import monitoring

    events: dict[str, float] = {}

    def listen(name: str, secs: float, **_: object) -> None:
        for key in ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration",
                    "backend_compile_duration"):
            if name.endswith(key):
                events[key] = events.get(key, 0.0) + secs
    monitoring.register_event_duration_secs_listener(listen)
    with contextlib.redirect_stdout(io.StringIO()):
        sys.argv = ["npujax", "lower", *args, "--no-progress"]
        code = cli.main()  # (as the program runs it: its own process's start-up)
    marks.append(("end", time.process_time(), peak()))
    if code:
        raise SystemExit(f"npujax lower failed ({code})")
    out = [{"phase": a[0], "cpu_s": b[1] - a[1], "peak_mb": b[2]}
           for a, b in zip(marks[:-1], marks[1:])]
    print(json.dumps({"phases": out, "events": events}))


def phases(trees: list[str], args: list[str], label: str) -> None:
    """Print where ``npujax lower ARGS`` spends its CPU time and memory in each tree, cold (a
    fresh compile cache) and warm (the same again), in fresh processes, interleaved."""
    import json

    got = {}
    with tempfile.TemporaryDirectory() as root:
        for state in ("cold", "warm"):
            for tree in trees:
                cache = str(Path(root) / Path(tree).resolve().name)
                env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve()),
                       "NPUJAX_COMPILE_CACHE": cache}
                r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                                    " ".join(args)], env=env, capture_output=True, text=True,
                                   cwd=root)
                if r.returncode:
                    print(f"  {tree} {state}: failed: {r.stderr[-500:]}")
                    continue
                got[tree, state] = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"phases of `npujax lower {label}` (CPU s; peak RSS at the end of the phase, MB):")
    for tree in trees:
        for state in ("cold", "warm"):
            if (tree, state) not in got:
                continue
            res = got[tree, state]
            total = sum(p["cpu_s"] for p in res["phases"])
            print(f"  {Path(tree).resolve().name} {state}: {total:.2f} s CPU in the process, "
                  f"peak {res['phases'][-1]['peak_mb']:.0f} MB")
            for p in res["phases"]:
                print(f"    {p['phase']:<26} {p['cpu_s']:6.2f} s ({p['cpu_s'] / total:4.0%}) "
                      f"{p['peak_mb']:6.0f} MB")
            ev = res["events"]
            print("    of the cost program: tracing {:.2f} s, lowering {:.2f} s, compiling or "
                  "loading {:.2f} s (JAX's events, wall)".format(
                      ev.get("jaxpr_trace_duration", 0.0),
                      ev.get("jaxpr_to_mlir_module_duration", 0.0),
                      ev.get("backend_compile_duration", 0.0)))


def program_size_child(model: str, dataflows: int, npu: str) -> None:
    """Compile the layer-table cost program of ``model``'s decode step at the first
    ``dataflows`` systolic dataflows (no cache) and print, as JSON, the CPU seconds of tracing
    and of compiling, the peak RSS before and after (MB) and the optimized HLO's lines."""
    import importlib
    import json
    import resource

    import jax
    import numpy as np

    from npujax.hw import load_npu_spec
    from npujax.models.decoders import decoder_graph
    from npujax.models.hf_config import load_decoder
    from npujax.plan import workloads
    from npujax.plan.table import layer_table, table_length
    from npujax.systolic import DATAFLOWS

    lower = importlib.import_module("npujax.plan.lower")
    spec = load_npu_spec(npu)
    layers = workloads(decoder_graph(load_decoder(model), phase="decode", kv_len=1024), spec)
    length = table_length(len(layers))
    w = np.full(length, 8.0, np.float32)
    fn = jax.jit(lower._table_costs(DATAFLOWS[:dataflows]),
                 compiler_options=lower._cost_options())
    args = (lower._program_spec(spec), w, w, layer_table(layers, length))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t = time.process_time()
    lowered = fn.lower(*args)
    traced = time.process_time() - t
    t = time.process_time()
    compiled = lowered.compile()
    compile_s = time.process_time() - t
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"trace_s": traced, "compile_s": compile_s, "peak_before_mb": before,
                      "peak_after_mb": after, "hlo_lines": compiled.as_text().count("\n")}))


def program_size(model: str, npu: str, repeats: int) -> None:
    """The cost program's compile time and memory at one and at three dataflows (fresh
    processes, interleaved, medians): what one set of formulas for every dataflow would
    save."""
    import json

    runs: dict[int, list[dict[str, float]]] = {1: [], 3: []}
    for _ in range(repeats):
        for n in (1, 3):
            r = subprocess.run([sys.executable, str(Path(__file__).resolve()),
                                "--program-size-child", f"{model},{n},{npu}"],
                               capture_output=True, text=True, check=True)
            runs[n].append(json.loads(r.stdout.strip().splitlines()[-1]))
    print(f"the layer-table cost program of {model}'s decode step on {npu}, no cache "
          f"(medians of {repeats}):")
    for n, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"  {n} dataflow{'s' if n > 1 else ' '}: trace + lower {med['trace_s']:.2f} s, "
              f"compile {med['compile_s']:.2f} s CPU; peak RSS {med['peak_before_mb']:.0f} -> "
              f"{med['peak_after_mb']:.0f} MB "
              f"(+{med['peak_after_mb'] - med['peak_before_mb']:.0f}); "
              f"{med['hlo_lines']:.0f} lines of optimized HLO")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", default="/work/main,.")
    ap.add_argument("--models", default="qwen2.5-0.5b,llama-3.1-8b,"
                                        "experiments/llm_configs/mixtral-8x7b.json")
    ap.add_argument("--phases", default="decode,prefill", help="decoder steps to lower")
    ap.add_argument("--npu", default="edge_16x16", help="preset (default: the command's)")
    ap.add_argument("--case", action="append", default=[],
                    help="another command: 'readme' or the arguments after 'npujax lower'")
    ap.add_argument("--phases-of", help="the command whose phases to print: 'readme' or the "
                    "arguments after 'npujax lower' (default the first model's decode step)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--program-size", action="store_true",
                    help="only the cost program's compile time and memory at one and at three "
                    "dataflows (the first model's decode step)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--program-size-child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        child(a.child.split())
        return
    if a.program_size_child is not None:
        model, n, npu = a.program_size_child.split(",")
        program_size_child(model, int(n), npu)
        return
    if a.program_size:
        program_size(a.models.split(",")[0], a.npu, a.repeats)
        return
    trees, models, steps = a.trees.split(","), a.models.split(","), a.phases.split(",")
    from _bytecode import as_installed

    as_installed(trees)
    cases = [(Path(m).name, step, lower_args(m, step, a.npu)) for m in models for step in steps]
    cases += [(f"case {i + 1}", "", case_args(c)) for i, c in enumerate(a.case)]
    print(f"load average at start: {os.getloadavg()}; --npu {a.npu}")
    for i, c in enumerate(a.case):
        print(f"case {i + 1}: npujax lower {' '.join(case_args(c))}")
    print(f"{'checkout':<16} {'model':<24} {'phase':<8} {'cache':<5} {'CPU s':>6} "
          f"{'peak MB':>8}")
    got: dict[tuple[str, str, str, str], list[tuple[float, float]]] = {}
    for name, step, args in cases:
        for _ in range(a.repeats):
            for tree in trees:  # interleaved: the machine's load falls on every tree alike
                with tempfile.TemporaryDirectory() as cache:
                    for state in ("cold", "warm"):
                        r = run(tree, args, cache)
                        shown = (f"{r[0]:6.2f} {r[1]:8.0f}" if r
                                 else "  (this checkout cannot lower it)")
                        print(f"{Path(tree).resolve().name:<16} {name:<24} {step:<8} "
                              f"{state:<5} {shown}", flush=True)
                        if r:
                            got.setdefault((tree, name, step, state), []).append(r)
    print(f"load average at end: {os.getloadavg()}")
    if len(trees) == 2:
        before, after = trees
        print(f"medians, {Path(before).resolve().name} -> {Path(after).resolve().name} "
              "(CPU s; peak MB) and the ratio before/after:")
        for name, step, _ in cases:
            for state in ("cold", "warm"):
                b, n = (got.get((t, name, step, state)) for t in (before, after))
                if not b or not n:
                    continue
                bc, nc = (statistics.median(x[0] for x in v) for v in (b, n))
                bm, nm = (statistics.median(x[1] for x in v) for v in (b, n))
                print(f"  {name:<24} {step:<8} {state:<5} {bc:5.2f} -> "
                      f"{nc:5.2f} s ({bc / nc:4.2f}x); {bm:4.0f} -> {nm:4.0f} MB "
                      f"({bm / nm:4.2f}x)")
    shown = case_args(a.phases_of) if a.phases_of else lower_args(models[0], "decode", a.npu)
    phases(trees, shown, " ".join(shown))


if __name__ == "__main__":
    main()
