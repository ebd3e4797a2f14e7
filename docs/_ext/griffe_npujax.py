"""Griffe extension: npujax docstrings (Sphinx roles, ``#:`` comments, RST tables) in mkdocs.

The docstrings are Google style and cross-reference with Sphinx roles (``:func:`lower```,
``:class:`~npujax.errors.ConfigError```, ``:mod:`.onnx```). mkdocstrings does not read roles, so
this extension rewrites each one into an autorefs link, ``[`lower`][npujax.plan.lower.lower]``:

* a dotted name starting with ``npujax`` is used as written;
* a name starting with ``.`` is relative to the docstring's package;
* any other name is resolved in the docstring's scope as Python would (the object's members,
  the module's imports, then the parents), first component first (``Quantizer.init_state``);
* ``~`` shows only the last component, as in Sphinx;
* the link goes to where the object is defined (``npujax.lower`` -> ``npujax.plan.lower.lower``);
* names of other projects (``jax.custom_vjp``) are shown as code: their documentation is not
  available offline to link to.

A name that does not resolve is kept as a link to itself, so ``mkdocs build --strict`` fails on
it ("Could not find cross-reference target"): a stale reference in a docstring breaks the docs
build, not silently the reader. A paragraph ending in reStructuredText's ``::`` (a literal
block follows) ends in ``:``, and reStructuredText simple tables become markdown tables.

Attributes documented by a Sphinx ``#:`` comment above their assignment (``OPS``, ``QUANTIZERS``,
``BREAKDOWN``, ...) get that comment as their docstring, so they are rendered and can be linked.

A subpackage's curated API (the names its ``__init__`` re-exports in ``__all__``) becomes a
linked table appended to its docstring, and the re-exported aliases are not rendered a second
time: the API pages render each subpackage with its submodules (``show_submodules``), so every
object is documented once, where it is defined, and ``npujax.search.search_precision`` links to
``npujax.search.api.search_precision``.

Only the rendered documentation changes; the source files are not modified.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(func|class|mod|meth|attr|data|exc|obj|const):`([^`<>]+)`")
_LITERAL = re.compile(r"(\S)::$", re.MULTILINE)
_BORDER = re.compile(r"^=+(?: +=+)+ *$")
#: Packages whose objects are shown as code, not linked (their docs are not available offline).
_EXTERNAL = ("jax", "jnp", "flax", "nnx", "optax", "onnx", "numpy", "np", "scipy", "matplotlib")


def _objects(obj: griffe.Object):
    """Every non-alias object under ``obj`` (itself included)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)  # type: ignore[arg-type]


def _package(obj: griffe.Object) -> griffe.Object:
    mod = obj if obj.is_module else obj.module
    return mod if mod.is_init_module else mod.parent  # type: ignore[return-value]


def _target(obj: griffe.Object, name: str) -> str | None:
    """The full path ``name`` refers to from ``obj``'s docstring: None for another project's
    object, ``name`` itself when it does not resolve (autorefs then reports it)."""
    if name.startswith("."):
        return f"{_package(obj).path}{name}"
    root = name.split(".")[0]
    if root == "npujax":
        return name
    if root in _EXTERNAL:
        return None
    head, _, rest = name.partition(".")
    try:
        path = obj.resolve(head)
    except (griffe.NameResolutionError, AttributeError):
        return name
    if not path.startswith("npujax."):
        return None
    return f"{path}.{rest}" if rest else path


def _canonical(pkg: griffe.Module, path: str) -> str:
    """Where ``path`` is defined (``npujax.lower`` -> ``npujax.plan.lower.lower``), so that a
    link through a re-export lands on the one rendered definition."""
    if not path.startswith(pkg.path + "."):
        return path
    try:
        return pkg[path[len(pkg.path) + 1:]].canonical_path
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return path  # unresolved: autorefs reports it


def _columns(border: str) -> list[int]:
    return [m.start() for m in re.finditer(r"=+", border)]


def _rst_tables(text: str) -> str:
    """reStructuredText simple tables (``===  ===`` borders) as markdown tables. A line whose
    first column is blank continues the row above."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        if not _BORDER.match(lines[i]):
            out.append(lines[i])
            i += 1
            continue
        starts, rows, borders, i = _columns(lines[i]), [], 1, i + 1
        while i < len(lines) and borders < 3:
            line = lines[i]
            i += 1
            if _BORDER.match(line):
                borders += 1
                continue
            cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
            if rows and not cells[0]:
                rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
            else:
                rows.append(cells)
        header, *body = rows
        if out and out[-1].strip():
            out.append("")
        out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                *("| " + " | ".join(r) + " |" for r in body), ""]
    return "\n".join(out)


def _rewrite(pkg: griffe.Module, obj: griffe.Object, text: str) -> str:
    def link(m: re.Match[str]) -> str:
        name = "".join(m.group(2).split())  # a role may wrap over two lines
        short = name.startswith("~")
        name = name.lstrip("~")
        shown = name.rsplit(".", 1)[-1] if short else name.lstrip(".")
        target = _target(obj, name)
        if target is None:
            return f"`{shown}`"  # no inventory of other projects' docs offline
        return f"[`{shown}`][{_canonical(pkg, target)}]"

    return _rst_tables(_LITERAL.sub(r"\1:", _ROLE.sub(link, text)))


def _comment_docstring(attr: griffe.Object) -> str | None:
    """The ``#:`` comment lines right above an attribute's assignment, or None."""
    if attr.lineno is None or attr.filepath is None:
        return None
    lines = attr.lines_collection[attr.filepath]  # type: ignore[index]
    found: list[str] = []
    i = attr.lineno - 2  # the line above the assignment, 0-based
    while i >= 0 and lines[i].lstrip().startswith("#:"):
        found.insert(0, lines[i].lstrip()[2:].strip())
        i -= 1
    return "\n".join(found) or None


def _summary(obj: griffe.Object | griffe.Alias) -> str:
    try:
        doc = obj.docstring
    except griffe.AliasResolutionError:
        return ""
    if doc is None:
        return ""
    return doc.value.strip().split("\n\n", 1)[0].replace("\n", " ").replace("|", "\\|")


def _export_table(pkg: griffe.Module) -> str | None:
    """A markdown table of the names ``pkg`` re-exports, linking to where they are defined."""
    rows = []
    for name in pkg.exports or ():
        member = pkg.members.get(name) if isinstance(name, str) else None
        if member is None or not member.is_alias:
            continue
        member.public = False  # documented where it is defined, not twice
        target = _canonical(pkg.package, member.target_path)
        rows.append(f"| [`{name}`][{target}] | {_summary(member)} |")
    if not rows:
        return None
    return (f"**Exports** (``from {pkg.path} import ...``):\n\n| name | summary |\n|---|---|\n"
            + "\n".join(rows))


class NpujaxDocstrings(griffe.Extension):
    """Rewrite Sphinx roles and ``#:`` comments of a loaded package (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader,
                   **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.docstring is None and obj.is_attribute:
                text = _comment_docstring(obj)
                if text:
                    obj.docstring = griffe.Docstring(text, lineno=obj.lineno, parent=obj)
            if obj.docstring is not None:
                obj.docstring.value = _rewrite(pkg, obj, obj.docstring.value)
        for obj in _objects(pkg):
            if obj.is_module and obj.is_init_module and obj is not pkg:
                table = _export_table(obj)  # type: ignore[arg-type]
                if table and obj.docstring is not None:
                    obj.docstring.value += "\n\n" + table
