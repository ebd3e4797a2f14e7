"""Hostile arguments and inputs on the command line (issue #11, classes 2, 4, 6, 7): each is
refused before the work starts with one line and a non-zero exit code, and a run's --out
folder holds all of its files or none. In-process (``main([...])``) to stay fast."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import onnx
import pytest

from npujax._atomic import MANIFEST, staged_dir
from npujax.cli import main
from npujax.errors import OutputError
from tests import hostile_inputs as hi


def _run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse errors
        code = e.code
    err = capsys.readouterr().err
    return code, err


@pytest.fixture(scope="module")
def small_onnx(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "conv.onnx"
    onnx.save(hi.conv(1, 8, c_in=3, c_out=4), path)
    return path


@pytest.mark.parametrize("argv, code, message", [
    (["search", "m.npz", "--budget-latency", "nan"], 2, "finite number"),
    (["search", "m.npz", "--budget-latency", "inf"], 2, "finite number"),
    (["search", "m.npz", "--budget-latency", "-1"], 2, "finite number"),
    (["search", "m.npz", "--budget-ratio", "1.5"], 2, "finite number"),
    (["search", "m.npz", "--steps", "-1"], 2, ">= 1"),
    (["search", "m.npz", "--sensitivity-batch", "0"], 2, ">= 1"),
    (["search", "m.npz", "--sensitivity-batch", "-1"], 2, ">= 1"),
    (["search", "m.npz", "--seed", "-1"], 2, "2\\*\\*32"),
    (["search", "m.npz", "--out", ""], 2, "--out is empty"),
    (["lower", "m.onnx", "--out", ""], 2, "--out is empty"),
    (["lower", "m.onnx", "--batch", "0"], 2, ">= 1"),
    (["--max-tensor-bytes", "lots", "presets"], 2, "not a size"),
])
def test_bad_arguments_fail_before_work(capsys, argv, code, message):
    got, err = _run(capsys, *argv)
    assert got == code and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert pytest.importorskip("re").search(message, err), err


def test_search_out_naming_a_folder_fails_before_loading(capsys, tmp_path):
    code, err = _run(capsys, "search", str(tmp_path / "missing.npz"), "--out", str(tmp_path))
    assert code == 2 and "is a folder" in err  # not 'missing.npz does not exist': out first


@pytest.mark.parametrize("case", ["bomb", "clock", "cols"])
def test_issue_examples_on_the_command_line(capsys, tmp_path, small_onnx, case):
    if case == "bomb":
        path = tmp_path / "bomb.onnx"
        onnx.save(hi.constant_of_shape([30000, 30000]), path)
        code, err = _run(capsys, "lower", str(path))
        assert code == 9 and "max_tensor_bytes" in err
        code, _ = _run(capsys, "--max-tensor-bytes", "4GiB", "lower", str(tmp_path / "x.onnx"))
        assert code == 5  # (the option is accepted; the model is missing)
        return
    from importlib.resources import files

    text = files("npujax.presets").joinpath("edge_16x16.toml").read_text()
    text = (text.replace("clock_hz = 1.0e9", "clock_hz = 1e308") if case == "clock"
            else text.replace("cols = 16", "cols = 2147483648"))
    (tmp_path / "hw.toml").write_text(text)
    code, err = _run(capsys, "lower", str(small_onnx), "--npu", str(tmp_path / "hw.toml"),
                     "--out", str(tmp_path / "o"))
    assert code == 2 and "physical range" in err and not (tmp_path / "o").exists()


# --- the output folder as a transaction


def test_lower_out_is_published_whole_with_a_manifest(capsys, tmp_path, small_onnx):
    out = tmp_path / "o"
    assert _run(capsys, "lower", str(small_onnx), "--out", str(out))[0] == 0
    manifest = json.loads((out / MANIFEST).read_text())
    assert set(manifest["files"]) == {p.name for p in out.iterdir()} - {MANIFEST}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_failed_or_interrupted_run_keeps_the_previous_folder(capsys, tmp_path, small_onnx,
                                                           monkeypatch):
    out = tmp_path / "o"
    with staged_dir(out) as stage:  # a previous run's folder (published with its manifest)
        (stage / "schedule.json").write_text('{"previous": true}')
        (stage / "layers.csv").write_text("name\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    import npujax.report.lowering as lowering

    def half_then(exc):
        def write(folder, *a, **k):
            (folder / "schedule.json").write_text("{}")  # half of the new files
            raise exc
        return write

    for exc, code in ((KeyboardInterrupt(), 130),
                      (OSError(errno.ENOSPC, "No space left on device"), 10)):
        monkeypatch.setattr(lowering, "write_lowering", half_then(exc))
        got, err = _run(capsys, "lower", str(small_onnx), "--npu", "tpu_v1", "--out", str(out),
                        "--no-progress")
        assert got == code and len(err.strip().splitlines()) == 1, err
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_folder_with_the_users_files_keeps_them(capsys, tmp_path, small_onnx):
    """A run writes its files next to the user's (issue 28, item 7: it was refused, and a
    folder holding an earlier run too lost the user's file); one in the way is refused."""
    (tmp_path / "mine.txt").write_text("keep me")
    assert _run(capsys, "lower", str(small_onnx), "--out", str(tmp_path))[0] == 0
    assert _run(capsys, "lower", str(small_onnx), "--out", str(tmp_path))[0] == 0  # again
    assert (tmp_path / "mine.txt").read_text() == "keep me"
    assert "mine.txt" not in json.loads((tmp_path / MANIFEST).read_text())["files"]
    (tmp_path / "layers.csv").write_text("my own table")  # (the manifest lists npujax's)
    code, err = _run(capsys, "lower", str(small_onnx), "--out", str(tmp_path))
    assert code == 10 and "'layers.csv', changed since npujax wrote it" in err
    assert (tmp_path / "layers.csv").read_text() == "my own table"


def test_leftovers_of_killed_runs_are_cleaned_and_a_cut_publish_is_restored(tmp_path):
    out = tmp_path / "o"
    dead = 2**22 + 12345  # (above the usual pid_max of 4194304: never a live process)
    (tmp_path / f".o.staging-{dead}-abc").mkdir()
    (tmp_path / f".o.old-{dead}-abc").mkdir()
    (tmp_path / f".o.old-{dead}-abc" / MANIFEST).write_text("{}")
    with staged_dir(out) as stage:  # `o` is missing: the aside copy comes back first
        (stage / "a.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]
    assert (out / "a.txt").read_text() == "new"
    (tmp_path / f".x.{dead}.abc.tmp").write_text("partial")
    from npujax._atomic import atomic_write_text

    atomic_write_text(tmp_path / "x", "done")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o", "x"]


def test_staged_dir_refuses_a_file_and_reports_write_errors(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match="is a file"):
        with staged_dir(tmp_path / "f"):
            pass
    with pytest.raises(OutputError, match="No space"):
        with staged_dir(tmp_path / "o"):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert not os.path.exists(tmp_path / "o")


# --- resumption keyed by content (issue 28, item 8)


def test_sweep_of_a_replaced_model_is_not_resumed(capsys, tmp_path):
    """The issue's case: the model at the same path replaced, the same command. It reported
    '0 chunk(s) evaluated, 2 resumed' with the old model's latencies and exit 0."""
    model, out = tmp_path / "m.onnx", tmp_path / "s"
    argv = ["sweep", str(model), "--grid", "array.rows=8,16", "--chunk-size", "1",
            "--out", str(out), "--no-progress"]
    onnx.save(hi.conv(1, 8, c_in=3, c_out=4), model)
    assert _run(capsys, *argv)[0] == 0
    # the same sweep again: all resumed, and the rate is not printed as if measured now
    assert main(list(argv)) == 0
    out_text = " ".join(capsys.readouterr().out.split())
    assert "0 chunk(s) evaluated, 2 resumed; nothing left to evaluate (the run" in out_text
    same_layers = hi.conv(1, 8, c_in=3, c_out=4)
    same_layers.doc_string = "retrained"  # other bytes, the same layers
    for m, changed in ((same_layers, "the model file's contents changed"),
                       (hi.conv(1, 8, c_in=3, c_out=8), "the model file's contents and the "
                                                        "model's layers changed")):
        onnx.save(m, model)
        code, err = _run(capsys, *argv)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "holds a different sweep: " + changed in err and "--out" in err
def test_a_failed_run_leaves_no_empty_out_folder(capsys, tmp_path):
    """A command that fails after creating --out (here: quantize's missing --data file) removes
    the empty folders it created, parents included; a folder it did not create, or one holding
    files, stays (a new user's trial found `deep/a/b` left behind by every failed run)."""
    model = tmp_path / "m.onnx"
    onnx.save(hi.conv(1, 8, c_in=3, c_out=4), model)
    out = tmp_path / "deep" / "a" / "b"
    code, err = _run(capsys, "quantize", str(model), "--data", str(tmp_path / "missing.npz"),
                     "--out", str(out))
    assert code != 0 and "no such file" in err
    assert not (tmp_path / "deep").exists()
    (tmp_path / "mine").mkdir()
    code, _ = _run(capsys, "quantize", str(model), "--data", str(tmp_path / "missing.npz"),
                   "--out", str(tmp_path / "mine" / "q"))
    assert code != 0 and (tmp_path / "mine").is_dir() and not (tmp_path / "mine" / "q").exists()


# --- huge declared dimensions (issue 28): every command refuses before it allocates


@pytest.fixture(scope="module")
def huge_models(tmp_path_factory):
    """A conv declaring a 1x3x100000x100000 input (within max_tensor_elements: only what is
    materialized is too large), one whose 8x8 input a Resize blows up to 1x3x100000x100000
    inside the model, and a policy for them."""
    from onnx import helper as h
    from onnx import numpy_helper as nh

    d = tmp_path_factory.mktemp("huge")
    onnx.save(hi.conv(1, 100_000, c_in=3, c_out=4), d / "input.onnx")
    scales = nh.from_array(np.array([1, 1, 12500, 12500], np.float32), "scales")
    w = nh.from_array(np.zeros((4, 3, 3, 3), np.float32), "w")
    nodes = [h.make_node("Resize", ["x", "", "scales"], ["r"], mode="nearest"),
             h.make_node("Conv", ["r", "w"], ["y"], pads=[1, 1, 1, 1])]
    onnx.save(hi.model(nodes, [hi.vi("x", [1, 3, 8, 8])], [hi.vi("y", None)], [scales, w]),
              d / "inside.onnx")
    # a saved model taking the digits (8x8x1, NHWC) and resizing them inside, for calibrate
    from npujax.frontends.onnx import from_onnx
    from npujax.quantize.model_file import save_graph

    scales = nh.from_array(np.array([1, 12500, 12500, 1], np.float32), "scales")
    k = nh.from_array(np.zeros((1, 4), np.float32), "k")
    nodes = [h.make_node("Resize", ["x", "", "scales"], ["r"], mode="nearest"),
             h.make_node("MatMul", ["r", "k"], ["y"])]
    save_graph(d / "inside.npz", *from_onnx(hi.model(
        nodes, [hi.vi("x", [1, 8, 8, 1])], [hi.vi("y", None)], [scales, k])))
    for model, layer in (("input", "Conv_0"), ("inside", "Conv_1")):
        (d / f"policy-{model}.json").write_text(json.dumps({
            "format": "npujax.precision_policy/1", "weight_bits": {layer: 8},
            "act_bits": {layer: 8}}))
    return d


@pytest.mark.parametrize("command, model", [
    *((c, m) for c in ("search", "codesign", "qat") for m in ("input", "inside")),
    ("calibrate", "inside"),  # (saved models taking the digits only)
])
def test_huge_declared_dimensions_are_refused_before_allocation(capsys, huge_models, model,
                                                                command):
    # search died with MemoryError: std::bad_alloc and a traceback
    path, out = str(huge_models / f"{model}.onnx"), huge_models / f"out-{command}-{model}"
    if command == "calibrate":
        path = str(huge_models / "inside.npz")
    argv = {"search": ["search", path, "--data", "photos", "--out", str(out) + ".json"],
            "codesign": ["codesign", path, "--data", "photos", "--area-mm2", "10",
                         "--out", str(out)],
            "qat": ["qat", "--policy", str(huge_models / f"policy-{model}.json"), "--model", path,
                    "--data", "photos", "--out", str(out)],
            "calibrate": ["calibrate", path, "--out", str(out)]}[command]
    code, err = _run(capsys, *argv)
    assert code == 9, err
    errors = [line for line in err.splitlines() if line.startswith("npujax: error:")]
    assert "Traceback" not in err and len(errors) == 1, err
    assert "max_tensor_bytes" in errors[0] and "100000" in errors[0], err
    assert not out.exists() or not any(out.iterdir())  # (--out is created first, then empty)


def test_commands_that_only_compute_with_shapes_take_huge_declared_dimensions(capsys,
                                                                            huge_models,
                                                                            tmp_path):
    # lower, sweep, topology and fit allocate nothing of the declared size: they cost it
    code, err = _run(capsys, "topology", str(huge_models / "input.onnx"), "--out",
                     str(tmp_path / "t.csv"))
    assert code == 0, err
    assert "Conv_0, 100002, 100002" in (tmp_path / "t.csv").read_text()  # (padded)
