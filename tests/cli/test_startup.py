"""Start-up: ``npujax --help``, ``--version`` and every subcommand's ``--help`` load no
dependency. The parser reads the registry names it lists (dataflows, observers, searchers, ...)
from the registries' source (:func:`npujax._lazy.names`), never by importing them; these tests
check that it imports nothing heavy and that every name it read equals the imported registry's."""

import importlib
import subprocess
import sys

import pytest

from npujax import _lazy

HEAVY = ("jax", "jaxlib", "flax", "matplotlib", "onnx", "onnxruntime", "numpy", "scipy", "optax")


def test_building_the_parser_and_every_help_imports_nothing_heavy():
    code = (
        "import sys, contextlib, io\n"
        "import npujax.cli as cli\n"
        "p = cli.build_parser()\n"
        "sub = next(a for a in p._actions if a.dest == 'command')\n"
        "text = p.format_help() + ''.join(s.format_help() for s in sub.choices.values())\n"
        "assert all(c in text for c in sub.choices), 'a command has no help'\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    cli.main(['--version'])\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print(len(sub.choices), heavy)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    count, heavy = r.stdout.split(" ", 1)
    assert int(count) >= 10 and heavy.strip() == "[]", r.stdout


def test_every_name_the_parser_reads_is_the_registry_s(monkeypatch):
    """What the parser reads from the registries' source (as in a fresh process) equals the
    imported registries."""
    reads = []

    def recording(module, name, attr=None):
        reads.append((module, name, attr))
        return _lazy.names(module, name, attr)

    import npujax.cli as cli

    for command in cli.COMMANDS:  # the command modules bound `names` at import
        if hasattr(command, "names"):
            monkeypatch.setattr(command, "names", recording)
    cli.build_parser()
    assert len(reads) >= 10
    for module, name, attr in reads:
        live = _lazy.live_names(getattr(importlib.import_module(module), name), attr)
        assert _lazy.source_names(module, name, attr) == live, (module, name, attr)


def test_the_registry_forms_read_without_importing(tmp_path, monkeypatch):
    monkeypatch.setattr(_lazy, "_ROOT", tmp_path)
    monkeypatch.setattr(_lazy, "_TREES", {})
    (tmp_path / "a.py").write_text('class A:\n    """Alpha.\n\n    More."""\n    name = "a"\n'
                                   '    stage = "pre"\n')
    (tmp_path / "m.py").write_text(
        "from npujax.a import A\n\nclass B:\n    name = 'b'\n    stage = 'post'\n\n"
        "X = {x.name: x for x in (A, B())}\nY = {'b': B, 'a': A()}\nZ = {}\nW = tuple(Y)\n"
        "V: int = 3\n")
    assert _lazy.names("npujax.m", "X") == ("a", "b") and _lazy.names("npujax.m", "W") == ("b", "a")
    assert "npujax.m" not in sys.modules  # (read from the source: nothing imported)
    assert _lazy.names("npujax.m", "Y", "stage") == {"b": "post", "a": "pre"}
    assert _lazy.names("npujax.m", "X", "__doc__") == {"a": "Alpha.\n\nMore.", "b": None}
    assert _lazy.names("npujax.m", "Z") == () and _lazy.names("npujax.m", "V") == 3


@pytest.mark.parametrize("source", ["X = sorted(Y)\n", "X = {k: 1 for k in 'ab'}\n", ""])
def test_a_constant_in_another_form_is_refused(tmp_path, monkeypatch, source):
    monkeypatch.setattr(_lazy, "_ROOT", tmp_path)
    (tmp_path / "m.py").write_text(source)
    monkeypatch.setattr(_lazy, "_TREES", {})
    with pytest.raises(LookupError, match="X"):
        _lazy.names("npujax.m", "X")
