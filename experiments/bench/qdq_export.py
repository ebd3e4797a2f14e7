"""Time calibrate / to_onnx / convert on real models and check their outputs bit for bit.

Usage (from the checkout root, ``PYTHONPATH=$PWD``)::

    python3 experiments/bench/qdq_export.py dump OUT_DIR [models...]   # time, save outputs
    python3 experiments/bench/qdq_export.py compare DIR_A DIR_B         # exact equality

``dump`` builds each model (``cls``: PP-OCR direction classifier at (1, 3, 48, 192), 4 text
images; ``det``: PP-OCR detector at (1, 3, 320, 320), 2 text images; ``digits``: DigitsCNN, 2
batches of 32 random images; ``model:lsq`` with the LSQ quantizer, ``model:fp8block`` with
FP8 weights in blocks of 16, exported only), then times each library call once in a fresh
process state and counts the XLA compilations it makes (jax.monitoring's backend-compile
event). It saves the calibrated qstate, the exported ONNX bytes and every array of the
IntegerModel (``requant="float"`` and ``"fixed_point"``) as ``OUT_DIR/<model>.npz``.
``compare`` checks every array of two such dumps for equal dtype, shape and bytes and prints
the differences.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import jax
import numpy as np

_COMPILES: Counter = Counter()
_COMPILE_S: Counter = Counter()


def _listen(event, duration, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
        name = kw.get("fun_name", "?")
        _COMPILES[name] += 1
        _COMPILE_S[name] += duration


jax.monitoring.register_event_duration_secs_listener(_listen)


def _canon(obj, prefix, out):
    """Flatten ``obj`` into ``{path: np.ndarray}`` (strings and formats as their repr)."""
    if isinstance(obj, dict) or hasattr(obj, "items") and callable(obj.items):
        for k in sorted(obj, key=str):
            _canon(obj[k], f"{prefix}/{k}", out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _canon(v, f"{prefix}/{i}", out)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type) and not hasattr(obj, "dtype"):
        if type(obj).__name__ == "Graph":
            return
        for f in dataclasses.fields(obj):
            _canon(getattr(obj, f.name), f"{prefix}.{f.name}", out)
    elif obj is None or isinstance(obj, (str, bool)):
        out[prefix] = np.asarray(repr(obj))
    elif hasattr(obj, "dtype") or isinstance(obj, (int, float, np.generic)):
        out[prefix] = np.asarray(obj)
    else:
        leaves = jax.tree_util.tree_leaves_with_path(obj)
        if len(leaves) == 1 and leaves[0][1] is obj:
            out[prefix] = np.asarray(repr(obj))
        else:
            for path, leaf in leaves:
                _canon(leaf, prefix + jax.tree_util.keystr(path), out)


def _build(name):
    from npujax.frontends.onnx import from_onnx
    from npujax.ir.passes import optimize
    from tests.onnx_models import text_images, zoo_path

    if name == "digits":
        from flax import nnx

        from npujax.frontends.flax import trace_flax
        from npujax.models.cnn import DigitsCNN

        m = DigitsCNN(rngs=nnx.Rngs(0))
        x = np.random.default_rng(0).uniform(size=(64, 8, 8, 1)).astype(np.float32)
        graph, params = optimize(*trace_flax(m, x[:1]))
        return graph, params, [x[:32], x[32:]]
    model, shape, n = {"cls": ("ppocr_cls", (1, 3, 48, 192), 4),
                       "det": ("ppocr_det", (1, 3, 320, 320), 2)}[name]
    graph, params = optimize(*from_onnx(zoo_path(model), {"x": shape}))
    xs = text_images(shape[2], shape[3], 8, seed=2, flip_odd=True)
    return graph, params, [np.asarray(x, np.float32)[None] for x in xs[:n]]


# "model:variant" selects a quant_spec other than the default W8A8 STE one
_VARIANTS = {"": {}, "lsq": {"quantizer": "lsq"},
             "fp8block": {"weight_format": "fp8_e4m3fn", "weight_block_size": 16}}


def _timed(label, fn, times):
    _COMPILES.clear()
    _COMPILE_S.clear()
    t = time.perf_counter()
    r = fn()
    jax.block_until_ready(jax.tree_util.tree_leaves(r))
    dt = time.perf_counter() - t
    times[label] = {"s": round(dt, 3), "compiles": sum(_COMPILES.values()),
                    "compile_s": round(sum(_COMPILE_S.values()), 3),
                    "top": _COMPILES.most_common(6)}
    print(f"  {label:22s} {dt:7.2f} s  {sum(_COMPILES.values()):4d} compilations "
          f"({sum(_COMPILE_S.values()):.2f} s)  {_COMPILES.most_common(4)}", flush=True)
    if os.environ.get("QDQ_VERBOSE"):
        for k, v in _COMPILES.most_common():
            print(f"      {v:4d} x {k:40s} {_COMPILE_S[k]:.2f} s")
    return r


def dump(out_dir, names):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        _dump_one(name, out_dir)


def _dump_one(name, out_dir):
    from npujax.backends.integer import convert
    from npujax.backends.onnx_export import to_onnx
    from npujax.quantize.calibrate import calibrate
    from npujax.quantize.spec import quant_spec

    print(name, flush=True)
    base, _, variant = name.partition(":")
    graph, params, xs = _build(base)
    q = quant_spec(graph, **_VARIANTS[variant])
    times = {}
    qstate = _timed("calibrate", lambda: calibrate(graph, params, xs, q), times)
    proto = _timed("to_onnx", lambda: to_onnx(graph, params, q, qstate), times)
    _timed("to_onnx (again)", lambda: to_onnx(graph, params, q, qstate), times)
    arrays = {}
    _canon(qstate, "qstate", arrays)
    if variant != "fp8block":  # the integer path is int-only
        im_f = _timed("convert float", lambda: convert(graph, params, q, qstate,
                                                       requant="float"), times)
        im_x = _timed("convert fixed_point", lambda: convert(graph, params, q, qstate), times)
        _canon(im_f, "int_float", arrays)
        _canon(im_x, "int_fixed", arrays)
    arrays["onnx"] = np.frombuffer(proto.SerializeToString(), np.uint8)
    np.savez(out_dir / f"{name.replace(':', '_')}.npz", **arrays)
    (out_dir / f"{name.replace(':', '_')}.json").write_text(json.dumps(times, indent=1))


def compare(a_dir, b_dir):
    bad = 0
    for fa in sorted(Path(a_dir).glob("*.npz")):
        fb = Path(b_dir) / fa.name
        a, b = np.load(fa), np.load(fb)
        keys = set(a.files) | set(b.files)
        diff = []
        for k in sorted(keys):
            if k not in a.files or k not in b.files:
                diff.append(f"{k}: only in {'A' if k in a.files else 'B'}")
                continue
            x, y = a[k], b[k]
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                diff.append(f"{k}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}")
        bad += len(diff)
        print(f"{fa.stem}: {len(keys)} arrays ({a['onnx'].size} ONNX bytes), "
              f"{'IDENTICAL' if not diff else f'{len(diff)} DIFFER'}")
        for d in diff[:20]:
            print("   ", d)
    return bad


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "dump":
        dump(rest[0], rest[1:] or ["cls", "det", "digits"])
    else:
        sys.exit(1 if compare(*rest) else 0)
