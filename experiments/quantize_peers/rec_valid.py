"""PP-OCR rec's W8A8 files on more rendered lines than the 100 of the evaluation split.

``compare.py`` scores PP-OCR rec on the 100 held-out lines of ``npujax quantize``'s split (one
line = 1 point). This script prints the lines of that split each file misreads, then renders
``--lines`` more lines with ``--seed`` (:func:`npujax.data.images.text_lines`, the same
renderer; seed 0 drew the calibration and evaluation lines, so another seed gives lines that
are neither) and scores every file there with ``compare.py``'s code (exact match after
stripping the ends, CER, CTC greedy decoding with the file's dictionary), with the exact
McNemar test between the first two files (``paired.py``).

Usage::

    PYTHONPATH=. python3 experiments/quantize_peers/rec_valid.py --work /work/qpeers2 \\
        --file npujax_api_minmax_bc_model --file npujax_api_minmax_bc_weights --lines 400
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import _ctc_greedy, _evaluate, _outputs  # noqa: E402
from paired import mcnemar_exact  # noqa: E402


def main() -> None:
    import onnx

    from npujax.data.images import text_lines

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--file", action="append", required=True,
                    help="a folder of WORK/ppocr_rec holding model.qdq.onnx (repeat)")
    ap.add_argument("--lines", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    d = a.work / "ppocr_rec"
    fm = onnx.load(str(d / "float.onnx"))
    chars = next(["<blank>"] + p.value.split("\n") + [" "] for p in fm.metadata_props
                 if p.key == "character")
    files = {"float": d / "float.onnx", **{f: d / f / "model.qdq.onnx" for f in a.file}}
    ev = np.load(d / "eval.npz")
    out: dict = {"evaluation_misread": {}, "validation": {}}
    for k, f in files.items():
        text = [t.strip() for o in _outputs(f, ev["x"]) for t in _ctc_greedy(o, chars)]
        bad = [(i, str(y), t) for i, (t, y) in enumerate(zip(text, ev["text"])) if t != str(y)]
        out["evaluation_misread"][k] = bad
        print(f"evaluation split, {k}: misread {bad}", flush=True)
    t = time.perf_counter()
    x, s = text_lines(a.lines, a.seed, 48, 320)
    x, s = np.asarray(x, np.float32), np.asarray(s)
    print(f"rendered {len(x)} lines (seed {a.seed}) in {time.perf_counter() - t:.0f} s",
          flush=True)
    ok = {}
    for k, f in files.items():
        c, cer, _ = _evaluate(f, x, s, chars)
        ok[k] = c.astype(bool)
        out["validation"][k] = {"exact_match": 100 * float(c.mean()), "cer": cer}
        print(f"{a.lines} more lines, {k}: exact match {100 * c.mean():.2f} %, CER "
              f"{cer:.3f} %", flush=True)
    if len(a.file) >= 2:
        m, w = ok[a.file[0]], ok[a.file[1]]
        b, c = int(np.sum(m & ~w)), int(np.sum(~m & w))
        out["paired"] = {"only_first_right": b, "only_second_right": c,
                         "p_value": mcnemar_exact(b, c)}
        print(f"only {a.file[0]} right {b}, only {a.file[1]} right {c}: exact McNemar "
              f"p = {mcnemar_exact(b, c):.4f}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
