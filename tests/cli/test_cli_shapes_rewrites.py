"""``npujax lower --shapes/--buckets`` and ``--unsupported`` on a tiny ONNX model."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import run_cli


def _model(path):
    w = np.random.default_rng(0).normal(size=(4, 4, 5, 5)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["a"], pads=[2] * 4),
         helper.make_node("LeakyRelu", ["a"], ["y"], alpha=0.1)], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "H", "W"])],
        [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_shapes_buckets_and_rewrites(tmp_path):
    model = _model(tmp_path / "tiny.onnx")
    csv = tmp_path / "shapes.csv"
    csv.write_text("shape,probability\n8,0.6\n16,0.4\n")
    r = run_cli("lower", str(model), "--input-shape", "x=1,4,8,8", "--shapes", str(csv),
                "--buckets", "1..2", "--compile-s", "0", "--unsupported", "rewrite_or_fallback",
                "--no-progress")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    row = next(x for x in lines if "LeakyRelu" in x and "leaky_relu_max" in x)
    assert "rewrite" in row.split("leaky_relu_max")[1]  # the host round trip costs more
    plan1 = next(x for x in lines if "k<=1" in x)
    assert plan1.split("│")[2].split() == ["16"]
    assert "recommended: buckets 8 16" in r.stdout  # compiling is free: one per shape


def test_bad_buckets_and_shapes_are_one_line(tmp_path):
    model = _model(tmp_path / "tiny.onnx")
    r = run_cli("lower", str(model), "--input-shape", "x=1,4,8,8", "--shapes", "8x9:1", "9x8:1",
                "--no-progress")
    assert r.returncode != 0 and "neither contains the other" in r.stderr
    r = run_cli("lower", str(model), "--input-shape", "x=1,4,8,8", "--shapes", "8:1",
                "--buckets", "3..1", "--no-progress")
    assert r.returncode != 0 and "--buckets '3..1'" in r.stderr
    r = run_cli("lower", str(model), "--buckets", "2", "--no-progress")  # without --shapes
    assert r.returncode == 2 and "it needs --shapes" in r.stderr
