"""The ``npujax`` command line: one thin module per command (arguments, one workflow or API
call, printing).

Every :class:`~npujax.errors.NpujaxError` becomes a one-line ``npujax: error: ...`` message on
stderr and the error's exit code (2 config, 3 quantization, 4 calibration, 5 graph, 6 unsupported
op, 7 shape, 8 fetch, 9 resource limit); there is never a traceback for bad input. Results go
to stdout, progress notes to stderr (``-q`` hides them, ``-v`` adds details).

Building the parser imports no dependency (``npujax --help`` costs what
``python -c "import onnxruntime"`` does): a command module imports at its top only the standard
library and npujax's light modules (``errors``, ``_lazy``, ``_progress``, ``cli._common``),
reads the registry names its ``add_parser`` lists with ``npujax._lazy.names`` (from the
registry's source, without importing it), and imports the rest inside ``run``.
``tests/cli/test_startup.py`` checks both.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from npujax._version import __version__
from npujax.cli import (
    calibrate,
    codesign,
    demo,
    fit,
    lower,
    presets,
    qat,
    quantize,
    search,
    sweep,
    topology,
)
from npujax.cli._common import configure_logging
from npujax.errors import ConfigError, NpujaxError

__all__ = ["main", "build_parser", "COMMANDS"]

#: The command modules, in ``--help`` order; each has ``add_parser(subparsers)`` and ``run``.
COMMANDS = (demo, lower, fit, sweep, search, codesign, qat, calibrate, quantize, presets,
            topology)


class _Parser(argparse.ArgumentParser):
    """argparse with npujax's error contract: one ``npujax: error: ...`` line, exit code 2."""

    #: Whether positional arguments may follow options (``npujax lower --npu X A.onnx B.onnx``):
    #: the command's parser then parses with :meth:`parse_known_intermixed_args`.
    intermixed = False
    _intermixing = False

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"npujax: error: {message} (see '{self.prog} --help')\n")

    def parse_known_args(self, args=None, namespace=None):
        if not self.intermixed or self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True  # parse_known_intermixed_args calls parse_known_args twice
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    p = _Parser(
        prog="npujax",
        description="Differentiable NPU modelling in JAX: QAT, mixed-precision search and "
                    "per-layer latency on a systolic-array NPU.",
    )
    p.add_argument("--version", action="version", version=f"npujax {__version__}")
    verbosity = p.add_mutually_exclusive_group()
    verbosity.add_argument("-v", "--verbose", action="store_const", const=1, dest="verbosity",
                           default=0, help="more messages (debug details) on stderr")
    verbosity.add_argument("-q", "--quiet", action="store_const", const=-1, dest="verbosity",
                           help="only warnings and errors on stderr")
    for flag, var, example in (("--max-tensor-bytes", "NPUJAX_MAX_TENSOR_BYTES", "4GiB"),
                               ("--max-model-bytes", "NPUJAX_MAX_MODEL_BYTES", "8GiB"),
                               ("--max-tensor-elements", "NPUJAX_MAX_TENSOR_ELEMENTS", "1e15")):
        p.add_argument(flag, metavar="SIZE", help=f"resource limit (e.g. {example}; default "
                       f"from ${var}, see docs/errors.md)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=_Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def _zoo_model(name: str) -> str:
    """``zoo:NAME`` on the command line: the cached path of a real ONNX model of the zoo."""
    from npujax.models.zoo import MODELS, fetch_model

    if name not in MODELS:
        raise ConfigError(f"unknown zoo model {name!r}; known: {', '.join(sorted(MODELS))} "
                          "(write zoo:ppocr_cls).")
    return str(fetch_model(name))


def _hard_exit(code: int) -> None:
    """Flush and leave at once, skipping the interpreter's teardown."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


#: Environment variable: the folder of the compiled-program cache of the command line, or "off".
COMPILE_CACHE_ENV = "NPUJAX_COMPILE_CACHE"


def compile_cache() -> str | None:
    """Keep the command line's programs between runs, in ``$NPUJAX_COMPILE_CACHE`` or
    ``<cache>/jax`` (``<cache>`` as for the model zoo: ``$NPUJAX_CACHE`` or
    ``~/.cache/npujax``):

    * JAX's persistent compilation cache (compiled XLA programs: the sweep's, training's,
      inference's);
    * ``npujax._program_cache``'s files: the cost programs ``npujax lower`` traced, as numpy
      programs (``npujax-exported/*-numpy-*``, JSON), the traced programs of ``npujax sweep``
      (``jax.export``), and the output shapes of the ONNX importer's operator signatures
      (``npujax-shapes/``). A later ``lower`` of a model of the same padded layer count, on
      any preset with the same structure, neither traces nor compiles its cost program.

    Nothing is changed when JAX already has a cache folder (``JAX_COMPILATION_CACHE_DIR`` or
    ``jax.config``) or with ``NPUJAX_COMPILE_CACHE=off``: neither cache is kept then.

    The folder holds code that runs (compiled machine code; programs whose steps npujax runs),
    so it is used only where it is the user's own
    (``npujax._program_cache.private_folder``: owned by this user, and neither it nor a
    folder above it writable by another user, but for sticky folders such as ``/tmp``); any
    other is skipped with a warning, and the programs are traced and compiled each run.

    Returns:
      The cache folder in use, or None.
    """
    import jax

    current = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
    if current:
        return str(current)
    want = os.environ.get(COMPILE_CACHE_ENV, "")
    if want.lower() == "off":
        return None
    from npujax import _program_cache
    from npujax.data.fetch import default_cache_dir

    folder = want or str(default_cache_dir() / "jax")
    problem = _program_cache.private_folder(folder)
    if problem:
        import logging

        why = ("" if problem.startswith("it cannot be created") else
               "; JAX and npujax run what that folder holds")
        logging.getLogger(__name__).warning(
            f"not keeping programs in {folder!r}: {problem}{why}. Use a folder only you can "
            f"write ({COMPILE_CACHE_ENV}=DIR) or {COMPILE_CACHE_ENV}=off.")
        return None
    jax.config.update("jax_compilation_cache_dir", folder)
    _program_cache.enable(folder)
    return folder


#: glibc's ``mallopt`` parameter ``M_ARENA_MAX`` (``<malloc.h>``).
_M_ARENA_MAX = -8
#: The commands whose process caps glibc's malloc arenas (:func:`_few_malloc_arenas`).
_FEW_ARENAS = ("lower",)


def _few_malloc_arenas(arenas: int = 2) -> bool:
    """Cap this process's glibc malloc arenas at ``arenas`` (``mallopt(M_ARENA_MAX)``), before
    XLA starts its threads; returns whether it was set.

    glibc gives each thread that allocates under contention an arena of its own, up to 8 per
    core, and memory freed in an arena stays with it. Compiling a program runs on XLA's
    threads: the HLO passes' and the serialization's transient copies of the program land in
    several arenas and stay there. Measured when ``lower`` compiled its cost program (it now
    runs it with numpy, and compiles only a program numpy cannot run): a first ``npujax lower
    decoder:qwen2.5-0.5b`` peaked at 386 MB on 2 cores, 339 MB with the arenas capped, at the
    same CPU time (``experiments/bench/llm_from_shapes.py``, ``docs/results/
    bench_lowering.md``). Only the ``npujax`` program's own process is capped (``main`` called
    from Python leaves the caller's allocator alone), and nothing changes where
    ``MALLOC_ARENA_MAX`` is set or the C library has no ``mallopt`` (not glibc).
    """
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``npujax`` console script; returns the exit code.

    In the ``npujax`` program's own process (``argv`` None) Python's cyclic garbage collector
    is off while the start-up imports JAX, and what they built is then frozen
    (:func:`gc.freeze`) before it is turned back on: each full collection otherwise scanned
    every object of JAX's modules, a tenth of a second each, three times in a warm ``npujax
    lower`` (0.25-0.4 of its 1.7-2.2 CPU s on 2 cores, at the same peak RSS). A caller's
    interpreter (``main`` called with ``argv``) is left alone.
    """
    own = argv is None  # the npujax program's own process
    if own:
        gc.disable()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command's own parser: its --help lists what it takes
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        commands.choices.get(args.command, parser).error(
            f"unrecognized arguments: {' '.join(extra)}")
    if own and args.command in _FEW_ARENAS:
        _few_malloc_arenas()
    configure_logging(args.verbosity)
    if args.verbosity < 0 and hasattr(args, "no_progress"):
        args.no_progress = True  # -q: progress lines are neither warnings nor errors
    compile_cache()
    if own:  # (the modules imported so far live as long as the process)
        gc.freeze()
        gc.enable()
    from npujax.cli._common import discard_created_outputs

    failed = True
    try:
        from npujax._atomic import run_kind
        from npujax.limits import limits

        with limits(**{k: v for k in ("max_tensor_bytes", "max_model_bytes",
                                      "max_tensor_elements")
                       if (v := getattr(args, k, None)) is not None}), run_kind(args.command):
            model = getattr(args, "model", None)
            if isinstance(model, list):  # `npujax lower A.onnx B.onnx`
                args.model = [_zoo_model(m[4:]) if m.startswith("zoo:") else m for m in model]
            elif str(model or "").startswith("zoo:"):
                args.model = _zoo_model(args.model[4:])
            code = int(args.fn(args) or 0)
        sys.stdout.flush()  # a reader that left shows here, inside the handler below
        failed = code != 0
        return code
    except NpujaxError as e:
        print(f"npujax: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        # Outputs are transactions (npujax._atomic): nothing half-written is left. Exit now,
        # without the interpreter's teardown, which can crash (SIGSEGV) while XLA threads or
        # host callbacks of the interrupted computation are still alive.
        print("npujax: interrupted; no half-written output was left", file=sys.stderr)
        if argv is None:  # the npujax program (not main([...]) called from Python)
            _hard_exit(130)
        return 130
    except BrokenPipeError:
        # e.g. `npujax search ... | head`: the reader left; outputs are already written
        # (atomically), so exit quietly as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:  # an OS failure not already turned into an NpujaxError
        print(f"npujax: error: {e.strerror or e}"
              f"{' (' + str(e.filename) + ')' if e.filename else ''}", file=sys.stderr)
        return 1
    finally:
        discard_created_outputs(failed)
