"""Issue 14: the Stream comparison finds committed results whatever --work is."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXP = ROOT / "experiments" / "stream_comparison"


def _main_module():
    spec = importlib.util.spec_from_file_location("stream_cmp_main", EXP / "main.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_stream_results_are_found_under_any_work_folder(tmp_path):
    mod = _main_module()
    stream = json.loads((EXP / "stream_2.1.1_results.json").read_text())
    for name in mod.MODELS:
        path = str(tmp_path / "work" / f"{name}.onnx")  # as main() builds it under --work
        st = mod.stream_result(stream, path)
        assert st is not None and st["cycles"] > 0, name
    assert mod.stream_result({"/old/run/a.onnx": {"cycles": 1}}, "/old/run/a.onnx") == {
        "cycles": 1}
    assert mod.stream_result(stream, str(tmp_path / "other.onnx")) is None
