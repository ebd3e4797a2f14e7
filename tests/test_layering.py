"""The package's import structure: no cycles, imports only point down the pipeline, the library
never imports workflows/ or cli/, and only the ONNX frontend and the backends import onnx."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "npujax"

#: Packages in pipeline order: a module may import modules of its own rank or lower.
RANK = {
    "errors": 0, "limits": 0, "_atomic": 0, "_progress": 0, "_version": 0, "_exact": 0,
    "_relax": 0, "_html": 0, "_lazy": 0, "_program_cache": 0, "_xla_options": 0,
    "_jaxpr_numpy": 0,
    "numerics": 1, "calib": 1, "systolic": 1, "data": 1,
    "hw": 2,
    "ops": 3, "ir": 3,
    "frontends": 4, "quantize": 4, "backends": 4,
    "plan": 5, "search": 5, "report": 5, "models": 5, "explore": 5,
    "workflows": 6,
    "cli": 7,
    "__main__": 8,  # python -m npujax: the command line, above everything
}
#: Modules that may import onnx (``ops.host`` and ``ops._onnx`` only inside the functions that
#: run or export a CPU-fallback node, which exist only in imported models).
ONNX_IMPORTERS = {"npujax.frontends.onnx", "npujax.backends.onnx_export", "npujax.ops.host",
                  "npujax.ops._onnx",
                  # reads an exported file's Q/DQ pairs to tap them (qdq_pair_mismatches)
                  "npujax.backends.ort_check"}


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _runtime_imports(path: Path, names: set[str]):
    """(module imported, line) for every import outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                yield (sub if sub in names else node.module), node.lineno


@pytest.fixture(scope="module")
def graph():
    mods = dict(_modules())
    names = set(mods)
    edges = {m: {(t, line) for t, line in _runtime_imports(p, names)} for m, p in mods.items()}
    return mods, edges


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_import_cycles(graph):
    mods, edges = graph
    adj = {m: {t for t, _ in e if t in mods and t != m} for m, e in edges.items()}
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in adj:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_no_cycles_between_packages(graph):
    """Packages of one rank may import each other one way only (frontends may not import
    quantize while quantize imports frontends): the package graph has no cycle."""
    mods, edges = graph
    pk: dict[str, set[str]] = {}
    for m, e in edges.items():
        src = _package(m)
        for t, _ in e:
            if t.startswith("npujax.") and t in mods:
                dst = _package(t)
                if dst != src and "__init__" not in (src, dst):
                    pk.setdefault(src, set()).add(dst)

    def reaches(a: str, b: str) -> list[str] | None:
        stack, seen = [[a]], {a}
        while stack:
            path = stack.pop()
            for n in pk.get(path[-1], ()):
                if n == b:
                    return [*path, n]
                if n not in seen:
                    seen.add(n)
                    stack.append([*path, n])
        return None

    cycles = sorted({" -> ".join([a, *c]) for a in pk for b in pk[a]
                     if (c := reaches(b, a)) is not None and len(c) > 1 and a < b})
    assert not cycles, f"package cycles: {cycles}"


def test_imports_point_down_the_pipeline(graph):
    mods, edges = graph
    bad = []
    for m, e in edges.items():
        src = _package(m)
        if src == "__init__":
            continue  # the curated API imports lazily (and statically only for type checkers)
        for t, line in e:
            if not t.startswith("npujax.") or t not in mods:
                continue
            dst = _package(t)
            if dst != src and RANK[dst] > RANK[src]:
                bad.append(f"{m}:{line} imports {t} ({src} rank {RANK[src]} < {dst} "
                           f"rank {RANK[dst]})")
    assert not bad, "\n".join(bad)
    assert set(RANK) >= {_package(m) for m in mods} - {"__init__", "presets"}


def test_only_the_onnx_frontend_and_backends_import_onnx(graph):
    mods, edges = graph
    users = {m for m, e in edges.items()
             if any(t == "onnx" or t.startswith("onnx.") for t, _ in e)}
    assert users <= ONNX_IMPORTERS, sorted(users - ONNX_IMPORTERS)


def test_the_latency_model_loads_without_onnx():
    code = ("import sys, npujax, npujax.plan, npujax.search, npujax.quantize, npujax.report;"
            "npujax.lower; assert 'onnx' not in sys.modules, 'onnx was imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
