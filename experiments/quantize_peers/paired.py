"""How large is an accuracy gap between two quantized files of the same model? A paired test.

Two files scored on the same examples differ only where one is right and the other wrong:
``b`` examples only the first gets right, ``c`` only the second. Under "equally accurate"
each of those ``b + c`` discordant examples is a fair coin, so the exact McNemar test's
two-sided p-value is ``P(Binomial(b + c, 1/2) <= min(b, c)) * 2`` (capped at 1). This script
scores the files of a ``compare.py`` work folder in onnxruntime (the same code as ``compare.py
peers``) on ``eval.npz`` and, where present, ``valid.npz``, and prints per pair: both
accuracies, ``b``, ``c``, the p-value, and the smallest ``b - c`` that the test would call
significant at 5 % with that many discordant examples.

Usage (the peers' venv or npujax's Python, both have onnxruntime)::

    python3 experiments/quantize_peers/paired.py --work /work/qpeers2 --model vit_mnist \\
        --pair 'npujax minmax' NNCF --pair 'npujax minmax' 'ORT MinMax'

Rows: ``float``, ``ORT MinMax``, ``ORT Entropy``, ``NNCF``, ``NNCF accuracy control
(max_drop 0.01)`` and every npujax row of ``runs.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import _evaluate  # noqa: E402 -- the scoring code of compare.py peers

PEER_FILES = {"float": "float.onnx", "ORT MinMax": "ort_minmax.qdq.onnx",
              "ORT Entropy": "ort_entropy.qdq.onnx", "NNCF": "nncf.qdq.onnx",
              "NNCF, fast_bias_correction=False": "nncf_bc.qdq.onnx",
              "NNCF accuracy control (max_drop 0.01)": "nncf_ac.qdq.onnx"}


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value of ``b`` vs ``c`` discordant examples."""
    n, k = b + c, min(b, c)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def smallest_significant(n: int, alpha: float = 0.05) -> int | None:
    """The smallest ``|b - c|`` with ``b + c = n`` that the exact test rejects at ``alpha``
    (None: none can)."""
    for k in range(n // 2, -1, -1):  # k = min(b, c), decreasing: |b - c| = n - 2k grows
        if mcnemar_exact(k, n - k) < alpha:
            return n - 2 * k
    return None


def _path(d: Path, label: str) -> Path:
    if label in PEER_FILES:
        return d / PEER_FILES[label]
    runs = json.loads((d / "runs.json").read_text())["npujax_runs"]
    if label not in runs:
        raise SystemExit(f"no row {label!r}; rows: {list(PEER_FILES) + list(runs)}")
    return d / runs[label]["dir"] / "model.qdq.onnx"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--pair", nargs=2, action="append", required=True, metavar=("A", "B"))
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    d = a.work / a.model
    splits = {"evaluation": np.load(d / "eval.npz")}
    if (d / "valid.npz").exists():
        splits["validation"] = np.load(d / "valid.npz")
    correct: dict[tuple[str, str], np.ndarray] = {}
    out = []
    for first, second in a.pair:
        for split, data in splits.items():
            for label in (first, second):
                if (label, split) not in correct:
                    correct[label, split] = _evaluate(_path(d, label), data["x"], data["y"],
                                                      None)[0].astype(bool)
            x, y = correct[first, split], correct[second, split]
            b, c = int(np.sum(x & ~y)), int(np.sum(~x & y))
            row = {"model": a.model, "split": split, "a": first, "b": second, "n": int(len(x)),
                   "a_accuracy": 100 * float(x.mean()), "b_accuracy": 100 * float(y.mean()),
                   "only_a_right": b, "only_b_right": c, "p_value": mcnemar_exact(b, c),
                   "smallest_significant_difference": smallest_significant(b + c)}
            out.append(row)
            need = row["smallest_significant_difference"]
            print(f"{a.model} {split} (n={row['n']}): {first} {row['a_accuracy']:.2f} % vs "
                  f"{second} {row['b_accuracy']:.2f} %: only {first} right {b}, only {second} "
                  f"right {c}; exact McNemar p = {row['p_value']:.3f} ("
                  + (f"|b - c| >= {need} needed at 5 %" if need is not None else
                     f"no split of {b + c} discordant examples is significant at 5 %") + ")",
                  flush=True)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
