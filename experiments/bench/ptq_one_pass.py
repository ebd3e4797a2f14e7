"""AdaRound and GPTQ in waves and in one layer-by-layer pass, in one interleaved run.

``AdaRound`` and ``GPTQ`` (``npujax.quantize.methods``) used to run the (partly quantized)
model over the calibration data once per wave of layers (layers none of which feeds another);
they now run it once, layer by layer (``npujax.quantize.methods._common.LayerPass``, on
``execute_nodes`` as the sequential bias correction does). The former form is kept as
``_apply(..., one_pass=False)``. Each run is a fresh Python process (its own compilations,
``NPUJAX_COMPILE_CACHE=off``) that imports the model as ``npujax quantize`` does (cls:
``unfold_batch``, 64 per batch; rec: as ``experiments/quantize_peers/rec_api.py``, 16 per
batch), builds the W8A8 spec (``quant_spec(graph, 8, 8)``), calibrates with min-max on the
``compare.py prepare`` folder's ``calib.npy`` (``--examples`` of them) and times the method
alone: CPU seconds (user + system, ``resource.getrusage``) and wall seconds. The forms of one
case run back to back (in ``--forms`` order), the cases in turn. Printed per case: each form's
figures (its process's peak RSS; that of the import and calibration; that of the method
alone, from ``VmHWM`` reset before it) with the load average before and after, each later
form's ratios to the first (< 1: faster, smaller), and the largest difference between their
kernels (relative to the largest kernel value).

AdaRound runs ``--adaround-iterations`` Adam steps per layer (paper: 10,000): its per-layer
optimization is the same in both forms, the pass is what differs.

``--forms`` picks the forms and their order (default ``waves,one_pass``); ``FORM@REV`` runs
that form from git revision ``REV`` of this repository (its tree extracted with ``git
archive`` into a temporary folder put first on the child's ``PYTHONPATH``), to compare a
change with the code before it in one interleaved run. Every form after the first is compared
with the first. A child whose resident memory passes ``--max-rss-gb`` (default: half the
memory available at the start) is killed and reported as such, not run to the machine's end.

Usage::

    PYTHONPATH=. python3 experiments/bench/ptq_one_pass.py --work /work/qpeers2 \\
        --cases ppocr_cls:adaround,ppocr_rec:gptq [--examples 256] [--adaround-iterations 20] \\
        [--forms one_pass@main,one_pass] [--max-rss-gb 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

#: How each model is imported and batched: the one-pass bias-correction bench's table
#: (``npujax quantize``'s defaults for cls, ``rec_api.py``'s for rec).
from bias_correction_one_pass import MODELS  # noqa: E402  (a sibling script)

CHILD = r'''
import json, resource, sys, time
import jax, numpy as np

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

def hwm_mb():  # the process's peak resident memory since start or the last reset_hwm()
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

def reset_hwm():  # (Linux: writing 5 to clear_refs resets VmHWM to the current RSS)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

from npujax.frontends.onnx import from_onnx
from npujax.ir.passes import optimize, unfold_batch
from npujax.quantize.calibrate import calibrate
from npujax.quantize.methods import GPTQ, AdaRound
from npujax.quantize.spec import quant_spec

d, method, form, cfg, out = sys.argv[1:6]
cfg = json.loads(cfg)
graph, params = optimize(*from_onnx(d + "/float.onnx", {"x": cfg["shape"]}))
if cfg["unfold"]:
    graph, params = unfold_batch(graph, params)
q = quant_spec(graph, 8, 8)
xc = np.load(d + "/calib.npy")[:cfg["examples"]]
cal = [xc[i:i + cfg["batch"]] for i in range(0, len(xc), cfg["batch"])]
qstate = calibrate(graph, params, cal, q, observer="minmax")
jax.block_until_ready(qstate)
setup_mb = hwm_mb()
reset_hwm()
m = AdaRound(iterations=cfg["iterations"]) if method == "adaround" else GPTQ()
c0, t0 = cpu(), time.perf_counter()
step = m._apply(graph, params, q, cal, qstate, one_pass=form == "one_pass")
jax.block_until_ready(step.params)
c1, t1 = cpu(), time.perf_counter()
method_mb = hwm_mb()
changed = sorted(n for n in step.quant if step.quant[n] is not q.get(n))
np.savez(out, **{n: np.asarray(step.params[n]["kernel"]) for n in changed})
print("RESULT " + json.dumps({"cpu_s": c1 - c0, "wall_s": t1 - t0, "layers": len(changed),
                              "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                              / 1024, "setup_peak_mb": setup_mb, "method_peak_mb": method_mb}))
'''


def _rss_gb(pid: int) -> float:
    """Resident memory of process ``pid`` in GB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def _available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    raise SystemExit("no MemAvailable in /proc/meminfo")


def _tree(rev: str, tmp: Path) -> Path:
    """Revision ``rev`` of this repository extracted into a folder under ``tmp``."""
    dest = tmp / f"tree_{rev.replace('/', '_')}"
    if not dest.exists():
        dest.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _run(work: Path, model: str, method: str, form: str, cfg: dict, out: Path, tree: Path,
         max_rss_gb: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "NPUJAX_COMPILE_CACHE": "off"}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryFile("w+") as so, tempfile.TemporaryFile("w+") as se:
        p = subprocess.Popen([sys.executable, "-c", CHILD, str(work / model), method, form,
                              json.dumps(cfg), str(out)], env=env, stdout=so, stderr=se,
                             text=True)
        killed = 0.0
        while p.poll() is None:
            rss = _rss_gb(p.pid)
            if rss > max_rss_gb:
                p.kill()
                p.wait()
                killed = rss
                break
            time.sleep(0.2)
        so.seek(0)
        se.seek(0)
        stdout, stderr = so.read(), se.read()
    if killed:
        return {"killed_at_gb": killed, "load": [load0, os.getloadavg()[0]]}
    if p.returncode:
        raise SystemExit(f"{model} {method} {form}: failed\n{stderr[-3000:]}")
    line = next(v for v in stdout.splitlines() if v.startswith("RESULT "))
    return {**json.loads(line[len("RESULT "):]), "load": [load0, os.getloadavg()[0]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="compare.py prepare's folder")
    ap.add_argument("--cases", default="ppocr_cls:adaround,ppocr_rec:gptq",
                    help="MODEL:METHOD,... (methods: adaround, gptq)")
    ap.add_argument("--examples", type=int, default=256)
    ap.add_argument("--adaround-iterations", type=int, default=20)
    ap.add_argument("--forms", default="waves,one_pass",
                    help="FORM[@REV],... (forms: waves, one_pass; REV: a git revision)")
    ap.add_argument("--max-rss-gb", type=float, default=None,
                    help="kill a child above this resident memory (default: half of "
                         "MemAvailable at the start)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    max_rss = a.max_rss_gb if a.max_rss_gb is not None else _available_gb() / 2
    print(f"children killed above {max_rss:.1f} GB resident", flush=True)
    forms = a.forms.split(",")
    for f in forms:
        if f.split("@")[0] not in ("waves", "one_pass"):
            raise SystemExit(f"--forms: unknown form {f!r}; use waves or one_pass, with @REV")
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {f: _tree(f.split("@")[1], Path(tmp)) if "@" in f else ROOT for f in forms}
        for case in a.cases.split(","):
            model, method = case.split(":")
            cfg = {**MODELS[model], "examples": a.examples,
                   "iterations": a.adaround_iterations}
            res = results[case] = {}
            for form in forms:
                r = res[form] = _run(a.work, model, method, form.split("@")[0], cfg,
                                     Path(tmp) / f"{model}_{method}_{form}.npz", trees[form],
                                     max_rss)
                if "killed_at_gb" in r:
                    print(f"{case:20s} {form:18s} killed at {r['killed_at_gb']:.1f} GB resident, "
                          f"load {r['load'][0]:.1f}->{r['load'][1]:.1f}", flush=True)
                    continue
                print(f"{case:20s} {form:18s} {r['cpu_s']:8.1f} CPU s {r['wall_s']:8.1f} wall s "
                      f"{r['layers']} layers, peak RSS {r['maxrss_mb']:.0f} MB (import and "
                      f"calibration {r['setup_peak_mb']:.0f}, the method {r['method_peak_mb']:.0f}"
                      f"), load "
                      f"{r['load'][0]:.1f}->{r['load'][1]:.1f}", flush=True)
            base = forms[0]
            for form in forms[1:]:
                if "killed_at_gb" in res[base] or "killed_at_gb" in res[form]:
                    continue
                fa = np.load(Path(tmp) / f"{model}_{method}_{base}.npz")
                fb = np.load(Path(tmp) / f"{model}_{method}_{form}.npz")
                diff = max((float(np.abs(fa[k] - fb[k]).max()) for k in fa.files), default=0.0)
                top = max((float(np.abs(fa[k]).max()) for k in fa.files), default=1.0)
                differ = sum(int(np.any(fa[k] != fb[k])) for k in fa.files)
                cmp = res[f"{form} vs {base}"] = {
                    "ratio_cpu": res[form]["cpu_s"] / res[base]["cpu_s"],
                    "ratio_wall": res[form]["wall_s"] / res[base]["wall_s"],
                    "ratio_rss": res[form]["maxrss_mb"] / res[base]["maxrss_mb"],
                    "ratio_method_rss": res[form]["method_peak_mb"] / res[base]["method_peak_mb"],
                    "kernels_differing": differ, "kernel_max_abs_diff": diff}
                print(f"{case:20s} {form} / {base}: CPU {cmp['ratio_cpu']:.3f}, wall "
                      f"{cmp['ratio_wall']:.3f}, peak RSS {cmp['ratio_rss']:.3f} (the method's "
                      f"{cmp['ratio_method_rss']:.3f}); kernels differ "
                      f"in {differ} of {len(fa.files)} layers, by <= {diff:.2e} "
                      f"({diff / top:.1e} of the largest)", flush=True)
    if a.json:
        a.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                      "examples": a.examples,
                                      "adaround_iterations": a.adaround_iterations,
                                      "forms": forms, "max_rss_gb": max_rss,
                                      "results": results}, indent=1))


if __name__ == "__main__":
    main()
