"""Run a Graph as a pure JAX function, in float or with fake-quant weights and activations.

``execute(graph, params, x, quant=..., qstate=...)`` is jit-able, differentiable (w.r.t. params
and the state's learned leaves, e.g. LSQ steps or a search's mixture probabilities) and
vmap-able: the Python loop over nodes unrolls at trace time, so one jitted call runs the whole
model.

Quantization is placed as on an integer NPU: for each node named in ``quant`` (a
:data:`~npujax.quantize.spec.QuantSpec`), the layer's quantizer fake-quantizes the input
activation (per tensor, on its calibrated grid) and the kernel (per output channel, per tensor or
per block); ``qstate[layer]`` is the quantizer's state (see
:mod:`npujax.quantize.quantizers`). This module needs of them only what
:class:`LayerQuantization` and :class:`NodeQuantizer` state, so the frontends, the backends and
the search run graphs without importing :mod:`npujax.quantize`.

One hook, ``observe``, lets a caller see and perturb what flows through the nodes (calibration
observers, per-layer SQNR, sensitivities): see :data:`Observe` and :func:`tap`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from npujax import _program_cache
from npujax.errors import GraphError, ShapeError
from npujax.ir.absent import any_absent
from npujax.ir.graph import SHAPES_ONLY_SOURCE, Graph, Node, Params
from npujax.limits import check_bytes, get_limits
from npujax.ops import OPS, run_op, weight_role
from npujax.ops.registry import NARROW_FLOATS, forward_only, is_forward_only

_log = logging.getLogger(__name__)

__all__ = ["execute", "execute_nodes", "inference", "check_run", "as_inputs", "layer_state",
           "tap", "Observe", "LayerQuantization", "NodeQuantizer", "MAX_CONSTANT_BYTES"]

#: ``observe(node, inputs, outputs)``, called twice for every node in graph order:
#:
#: * **before** it runs, with ``outputs=None`` and ``inputs`` the list of arrays the node
#:   receives (activations ``(batch, ...)`` float32 as ``graph.tensors`` declares them,
#:   constants as stored), before any fake-quant. Returning a list (same length, shapes and
#:   dtypes) replaces them; ``None`` keeps them. (Adding zeros here and differentiating with
#:   respect to them gives the gradient of the output w.r.t. an activation.)
#: * **after** it ran, with ``inputs`` as the operator read them (activations after fake-quant;
#:   the kernel is a parameter, not an input) and ``outputs`` its list of outputs. Whatever it
#:   returns other than ``None`` (any pytree of arrays) is recorded for the node.
#:
#: With ``observe``, :func:`execute` returns ``(output, {node_name: record})``. The hook runs at
#: trace time (inside ``jit``/``grad``/``vmap``), so it must be pure: results leave through its
#: records, not through side effects. A graph run per example (batch folded into a shape, see
#: :func:`execute`) calls it inside ``jax.vmap`` with batch-1 arrays and stacks the records
#: back to ``(batch, ...)``; arrays the hook needs per example go in as the arguments of a
#: ``jax.tree_util.Partial`` (leading axis the batch), which are mapped with the examples.
Observe = Callable[[Node, list[jax.Array], list[jax.Array] | None], Any]


class NodeQuantizer(Protocol):
    """What :func:`execute` asks of a layer's quantizer
    (:class:`npujax.quantize.quantizers.Quantizer` implements it)."""

    def coerce(self, state: Any, layer: str) -> Any:
        """``state`` as the quantizer's state type."""

    def quantize_input(self, node: Node, lq: Any, x: jax.Array, state: Any,
                       key: jax.Array | None = None) -> jax.Array:
        """The fake-quantized input activation."""

    def quantize_kernel(self, node: Node, lq: Any, w: jax.Array, state: Any,
                        key: jax.Array | None = None) -> jax.Array:
        """The fake-quantized kernel (or an embedding's table)."""

    def quantize_operand(self, node: Node, lq: Any, x: jax.Array, state: Any,
                         key: jax.Array | None = None) -> jax.Array:
        """The fake-quantized second activation operand of a GEMM of two activations."""


class LayerQuantization(Protocol):
    """What :func:`execute` asks of a layer's entry in the quantization spec
    (:class:`npujax.quantize.spec.LayerQuant` implements it)."""

    @property
    def quantizer(self) -> NodeQuantizer: ...

    @property
    def stochastic_rounding(self) -> bool: ...


def as_inputs(graph: Graph, x: jax.Array | Sequence[jax.Array]) -> list[jax.Array]:
    """``x`` as the list of graph inputs, after checking their shapes: float32 for floating
    inputs (as before), the declared type for integer and boolean ones (an ONNX model's integer
    inputs, such as token ids, keep integer semantics; int64 is held as JAX's default integer,
    int32 unless x64 is enabled).

    Raises:
      ShapeError: wrong number of inputs, a non-batch dimension that differs from the graph's,
        or values that the declared integer type cannot hold exactly.
    """
    # a sequence (list, tuple) holds one array per input; an array is the one input
    xs = list(x) if isinstance(x, Sequence) else [x]
    if len(xs) != len(graph.inputs):
        raise ShapeError(f"graph has {len(graph.inputs)} inputs {graph.inputs}, got {len(xs)}.")
    for name, v in zip(graph.inputs, xs):
        want = graph.tensors[name].shape
        if jnp.ndim(v) != len(want) or tuple(jnp.shape(v)[1:]) != tuple(want[1:]):
            raise ShapeError(
                f"input {name!r} must have shape (batch, {', '.join(map(str, want[1:]))}), "
                f"got {tuple(jnp.shape(v))}."
            )
    return [_as_input(name, v, graph.tensors[name].dtype) for name, v in zip(graph.inputs, xs)]


def _as_input(name: str, v: Any, dtype: str) -> jax.Array:
    """A float input as float32 (whatever it was given as), or in its declared 16-bit float
    type (``bfloat16``, ``float16``: the ops compute in float32 and round back, ONNX's output
    types); an integer or boolean one in its own type as JAX holds it, refused if its values do
    not fit that type exactly."""
    if dtype in NARROW_FLOATS:
        return jnp.asarray(v, dtype)
    dt = np.dtype(dtype)
    if dt.kind not in "iub":
        return jnp.asarray(v, jnp.float32)
    held = np.dtype(jax.dtypes.canonicalize_dtype(dt))
    if isinstance(v, jax.core.Tracer):
        return jnp.asarray(v, held)
    a = np.asarray(v)
    with np.errstate(invalid="ignore", over="ignore"):
        exact = np.array_equal(a, a.astype(held))
    if not exact:
        as_held = "" if held == dt else f" (held as {held} in JAX)"
        raise ShapeError(f"input {name!r} is {dt}{as_held}, but the values given do not fit it "
                         "exactly (non-integers or out of range; 64-bit inputs are 32-bit unless "
                         "JAX's x64 mode is on).")
    return jnp.asarray(a.astype(held))


def layer_state(quant: Mapping[str, LayerQuantization], qstate: Mapping[str, Any] | None,
                name: str) -> Any:
    """The typed state of layer ``name`` (None when ``qstate`` has none; a mapping of the
    quantizer's fields is converted to its state type)."""
    if qstate is None or name not in qstate:
        return None
    return quant[name].quantizer.coerce(qstate[name], name)


def tap(names: Collection[str]) -> Observe:
    """An :data:`Observe` hook that records, for each node in ``names``, ``(input, output)``:
    its first input as the operator read it (fake-quantized where the layer is quantized) and
    its first output; for a GEMM of two activations also its second operand, ``(input, output,
    operand)``. ``execute(graph, params, x, observe=tap(["conv1"]))`` returns ``(output,
    {"conv1": (input, output)})``."""
    wanted = frozenset(names)

    def observe(node: Node, inputs: list[jax.Array], outputs: list[jax.Array] | None) -> Any:
        if outputs is None or node.name not in wanted:
            return None
        if OPS[node.op].quantized_operands:
            return (inputs[0], outputs[0], *inputs[1:2])
        return (inputs[0], outputs[0])

    return observe


def execute(
    graph: Graph,
    params: Params,
    x: jax.Array | Sequence[jax.Array],
    *,
    quant: Mapping[str, LayerQuantization] | None = None,
    qstate: Mapping[str, Any] | None = None,
    key: jax.Array | None = None,
    observe: Observe | None = None,
) -> Any:
    """Evaluate ``graph`` on ``x``.

    Args:
      graph: the model graph (static; close over it when jitting).
      params: ``{node_name: {role: float32 array}}``.
      x: input batch, or a sequence of them for multi-input graphs; shape ``(batch, ...)`` with the
        non-batch dimensions the graph was built with; float32.
      quant: which GEMM nodes are quantized and how (see :func:`npujax.quant_spec`); None runs in
        float. A GEMM of two activations (MatMul, Einsum) fake-quantizes both operands.
      qstate: ``{layer: state}`` from :func:`npujax.calibrate` (or QAT / a search): each
        layer's quantizer state (calibrated grids, learned steps, mixture probabilities).
      key: a ``jax.random`` key for the layers with ``stochastic_rounding`` (one key per call,
        e.g. per training step; folded with the node index); None rounds to nearest.
      observe: a hook that sees every node's inputs and outputs, may replace its inputs and
        records what it returns (:data:`Observe`; :func:`tap` records inputs and outputs).

    Returns:
      The graph output (a tuple if it has several). With ``observe``, a pair
      ``(output, {node: record})``.

    A graph imported at batch 1 whose shapes fold the batch size (e.g. a classifier head written
    ``x.reshape(x.shape[0], -1)``) runs a larger batch by mapping over its examples with
    ``jax.vmap``: same numbers as one call per example, one compiled program.

    Raises:
      ShapeError: if ``x`` does not match the graph's input shapes.
      ConfigError: if ``qstate`` lacks what a quantized layer needs (a calibrated grid, a learned
        step, mixture probabilities), or holds another quantizer's state.
      UnsupportedOpError: if a node's operator has no implementation.
      LimitError: a tensor the run would materialize is over ``max_tensor_bytes``
        (:func:`check_run`; checked while tracing, before anything is allocated).
      GraphError: the graph was imported for its shapes only (``from_onnx(...,
        weights="shapes")`` with its external-data files absent): it has no real weights.
    """
    _check_real_weights(graph, params)
    xs = as_inputs(graph, x)
    check_run(graph, int(xs[0].shape[0]) if xs and xs[0].ndim else 1)
    if xs and xs[0].ndim and _per_example(graph, int(xs[0].shape[0])):
        return _execute_per_example(graph, params, xs, quant=quant, qstate=qstate, key=key,
                                    observe=observe)
    env: dict[str, jax.Array] = dict(zip(graph.inputs, xs))
    batch = int(xs[0].shape[0]) if xs and xs[0].ndim and graph.inputs \
        and graph.tensors[graph.inputs[0]].shape[:1] == (1,) else 1
    records: dict[str, Any] = {}
    env = _run_nodes(graph, params, env, range(len(graph.nodes)), batch, quant or {}, qstate, key,
                     observe, records)
    result = tuple(env[t] for t in graph.outputs)
    out = result[0] if len(result) == 1 else result
    return out if observe is None else (out, records)


def execute_nodes(
    graph: Graph,
    params: Params,
    env: Mapping[str, jax.Array],
    nodes: Sequence[int],
    *,
    batch: int,
    keep: Collection[str],
    quant: Mapping[str, LayerQuantization] | None = None,
    qstate: Mapping[str, Any] | None = None,
    observe: Observe | None = None,
) -> tuple[dict[str, jax.Array], dict[str, Any]]:
    """Run some of ``graph``'s nodes, as :func:`execute` runs them in the whole graph: a model
    run in pieces (a layer-by-layer method that changes a layer's params between pieces).

    Running ``range(len(graph.nodes))`` in one or several consecutive pieces, each piece given
    the tensors the earlier ones kept, computes what :func:`execute` computes, node by node
    with the same operations (fake-quant, per-example mapping of a batch-folded graph, a
    depthwise convolution's flattened rows, BatchNormalization's ``rsqrt``; jitted pieces may
    round differently from one jitted whole, as XLA fuses other operations). ``jax.jit`` it
    with ``graph``, ``nodes``, ``batch``, ``keep`` and ``observe`` static.

    Args:
      graph: the model graph.
      params: ``{node_name: {role: array}}``; only the nodes run are read.
      env: the activations the nodes read that no node of ``nodes`` writes (graph inputs
        as :func:`as_inputs` gives them, or what an earlier piece kept); constants come from
        the graph.
      nodes: indices into ``graph.nodes``, in increasing order.
      batch: the examples in the run (the first input's leading dimension).
      keep: the tensors to return, from ``env`` or written by ``nodes``.
      quant: as for :func:`execute`.
      qstate: as for :func:`execute`.
      observe: as for :func:`execute`; it sees the nodes run.

    Returns:
      ``({tensor: array} for keep, {node: record})``, the records as :func:`execute` returns
      them. A graph that :func:`execute` runs per example (batch folded, ``batch > 1``) holds
      its activations other than the graph inputs as stacked per-example arrays, ``(batch,
      *shape_at_batch_1)``: pass on what a piece kept unchanged.

    Raises:
      GraphError: a node reads a tensor that is neither in ``env``, a constant, nor written by
        an earlier node of ``nodes``.
    """
    order = list(nodes)
    if _per_example(graph, batch):
        inputs = frozenset(graph.inputs)

        def one(e):
            records: dict[str, Any] = {}
            out = _run_nodes(graph, params, {t: v[None] if t in inputs else v
                                             for t, v in e.items()},
                             order, 1, quant or {}, qstate, None, observe, records)
            return {t: e[t] if t in inputs else out[t] for t in keep}, records

        kept, records = jax.vmap(one, axis_size=batch)(dict(env))
        return kept, jax.tree.map(lambda a: a.reshape(a.shape[0], *a.shape[2:]), records)
    records = {}
    out = _run_nodes(graph, params, dict(env), order, batch, quant or {}, qstate, None, observe,
                     records)
    return {t: out[t] for t in keep}, records


def _per_example(graph: Graph, batch: int) -> bool:
    """Whether :func:`execute` runs ``batch`` examples of ``graph`` one example at a time."""
    return batch != 1 and _batch_folded(graph)


def _run_nodes(graph: Graph, params: Params, env: dict[str, jax.Array], nodes: Sequence[int],
               batch: int, quant: Mapping[str, LayerQuantization],
               qstate: Mapping[str, Any] | None, key: jax.Array | None,
               observe: Observe | None, records: dict[str, Any]) -> dict[str, jax.Array]:
    """Run ``graph.nodes[i]`` for ``i`` in ``nodes`` on ``env`` (tensor -> array; the graph's
    constants are added): the body of :func:`execute`, shared with :func:`execute_nodes`.
    Returns ``env`` with every output written; ``records`` gets ``observe``'s records."""
    env = {**{k: jnp.asarray(v) for k, v in graph.constants.items()}, **env}
    wanted = {graph.nodes[i].name for i in nodes}
    inv_std = _batchnorm_inv_std(graph, {k: v for k, v in params.items() if k in wanted})
    flattened = _flattened_by_consumer(graph)
    whole = is_forward_only() and observe is None and len(nodes) == len(graph.nodes)
    summed = _mean_scaled_by_consumer(graph, quant) if whole else {}
    for index in nodes:
        node = graph.nodes[index]
        if node.name in flattened:
            node = dataclasses.replace(node, attrs={**node.attrs, "flattened_by_consumer": True})
        if node.name in summed:
            pooled = summed[node.name]
            mark = ({"sum_only": True} if pooled is None else
                    {"output_scale": 1.0 / int(np.prod(env[pooled].shape[2:]))})
            node = dataclasses.replace(node, attrs={**node.attrs, **mark})
        missing = [t for t in node.inputs if t not in env]
        if missing:
            raise GraphError(f"node {node.name!r} reads {missing}, which no earlier node "
                             "computed and the run was not given; pass them in env.")
        ins = [_folded_concat_input(graph, node, t, env[t], batch) for t in node.inputs]
        p = dict(params.get(node.name, {}))
        if node.name in inv_std:
            p["inv_std"] = inv_std[node.name]
        if observe is not None and (replaced := observe(node, ins, None)) is not None:
            ins = list(replaced)
        lq = quant.get(node.name)
        if lq is not None:
            ka = kw = None
            if key is not None and lq.stochastic_rounding:
                ka, kw = jax.random.split(jax.random.fold_in(key, index))
            state = layer_state(quant, qstate, node.name)
            ins[0] = lq.quantizer.quantize_input(node, lq, ins[0], state, ka)
            if OPS[node.op].quantized_operands:
                ins[1] = lq.quantizer.quantize_operand(node, lq, ins[1], state, kw)
            else:  # the kernel, or an embedding's table
                role = weight_role(node)
                p[role] = lq.quantizer.quantize_kernel(node, lq, p[role], state, kw)
        outs = run_op(node, ins, p, [graph.tensors[t].dtype if t in graph.tensors else None
                                     for t in node.outputs])
        env.update(zip(node.outputs, outs))
        if observe is not None and (record := observe(node, ins, list(outs))) is not None:
            records[node.name] = record
    return env


#: Weights up to this many bytes are built into :func:`inference`'s program as constants; a
#: larger model's are passed as arguments (XLA would copy them into the program and the
#: persistent compilation cache key).
MAX_CONSTANT_BYTES = 64 << 20


def inference(
    graph: Graph,
    params: Params,
    *,
    quant: Mapping[str, LayerQuantization] | None = None,
    qstate: Mapping[str, Any] | None = None,
    max_constant_bytes: int = MAX_CONSTANT_BYTES,
) -> Callable[[Any], Any]:
    """A compiled forward pass of ``graph`` with fixed weights: ``f = inference(graph, params);
    y = f(x)`` computes ``execute(graph, params, x, quant=quant, qstate=qstate)``.

    The weights and the quantizer state are built into the program as constants (host copies
    taken now) instead of being passed as one argument per tensor (the PP-OCR classifier has
    214): XLA then folds everything that depends on the weights alone at compile time (kernel
    transposes and per-tap slices, BatchNormalization's ``rsqrt(var + eps)``, the fake-quantized
    kernels of ``quant``), and a call passes one input buffer. The operators are traced in
    their forward-only forms (:func:`npujax.ops.registry.forward_only`), which XLA:CPU compiles
    into fewer kernels, and a global average pool read only by Convs and Gemms is a sum whose
    readers scale their products (``_mean_scaled_by_consumer``). The numbers are those of
    :func:`execute` jitted with the weights as arguments up to float rounding: other orders of
    the same sums, some evaluated by XLA's constant folder (on the PP-OCR models the outputs
    differ by at most 1.5e-7 for cls, 1.9e-6 for rec's probabilities and 5.4e-9 for det's map,
    ``experiments/bench/execution.py``). Use it to run a model; train, calibrate or search
    (weights or state that change) with :func:`execute` and the weights as arguments.

    Compilation happens at the first call for each input shape (``jax.jit``); the program,
    weights included, is the key of JAX's persistent compilation cache when one is set
    (``npujax.cli.compile_cache`` for the command line, or ``jax_compilation_cache_dir``), so
    another process running the same model compiles nothing. Next to it, in that cache's
    folder where it is private (``npujax._program_cache.library_folder``), the first call
    keeps the traced program (``jax.export``), keyed by a digest of the graph, the weights, the
    quantization spec and state and the input's signature: another process running the same
    model neither traces nor lowers it either (the PP-OCR classifier's first call from the
    cache: 0.13 instead of 0.26 CPU s, ``experiments/bench/execution.py``). Every call then
    runs the exported program, the first as the later ones. A model that cannot be digested
    (a ``JaxPrimitive`` node, an operator or quantizer defined outside npujax, whose code may
    change between processes) is traced each time, as without a cache.

    Args:
      graph: the model graph.
      params: ``{node_name: {role: array}}``, as for :func:`execute`.
      quant: as for :func:`execute` (None runs in float).
      qstate: as for :func:`execute`: the calibrated or trained quantizer state.
      max_constant_bytes: weights (params and qstate together) larger than this are passed as
        arguments instead of constants.

    Returns:
      ``f(x) -> output``: ``x`` as for :func:`execute` (an array ``(batch, ...)`` or a sequence
      of them); the output as :func:`execute` returns it.

    Raises:
      GraphError: the graph or its params hold weights known by their shapes only (as
        :func:`execute`; raised here, before anything is compiled).
      ShapeError, ConfigError, UnsupportedOpError, LimitError: at the call, as :func:`execute`.
    """
    _check_real_weights(graph, params)
    host = jax.tree.map(np.asarray, params)
    state = None if qstate is None else jax.tree.map(np.asarray, qstate)
    nbytes = sum(int(a.nbytes) for a in jax.tree.leaves((host, state)))
    if nbytes <= max_constant_bytes:
        return _FixedInference(graph, host, quant, state)
    run = jax.jit(functools.partial(_run_passed, graph, quant))
    weights = jax.device_put((host, state))
    return functools.partial(run, weights)


class _FixedInference:
    """``f(x)`` of :func:`inference` with the weights as constants: ``jax.jit`` of
    ``_run_fixed``, or where :func:`npujax._program_cache.library_folder` names a folder, the
    exported program kept there (one per input signature, looked up once per process)."""

    def __init__(self, graph: Graph, host: Params, quant: Any, state: Any) -> None:
        self._fn = functools.partial(_run_fixed, graph, host, quant, state)
        self._jitted = jax.jit(self._fn)
        self._parts = (graph, host, quant, state)
        self._digest: str | None = None
        self._runs: dict[Any, Callable[..., Any]] = {}

    def __call__(self, x: Any) -> Any:
        leaves, tree = jax.tree.flatten(x)
        try:
            signature = (tree, tuple((type(a), a.shape, a.dtype) for a in leaves))
        except AttributeError:  # Python numbers or nested lists: as jax.jit takes them
            return self._jitted(x)
        run = self._runs.get(signature)
        if run is not None:
            return run(*leaves)
        where = _program_cache.library_folder()
        if where is None:
            return self._jitted(x)
        if self._digest is None:
            self._digest = _program_digest(*self._parts) or ""
        if not self._digest:
            return self._jitted(x)
        run = _program_cache.loaded(self._fn, (x,), name="inference", static=self._digest,
                                    where=where)
        with _program_cache.no_lapack(_program_cache.exported_of(run)):
            out = run(*leaves)
        self._runs[signature] = run
        return out


class _Undigestible(Exception):
    """A value :func:`_program_digest` cannot name by its contents."""


#: Modules whose classes and functions :func:`_program_digest` names by their qualified name
#: (npujax's source enters the programs' key; numpy's, JAX's and ml_dtypes' are versioned).
_DIGEST_MODULES = ("npujax", "numpy", "jax", "jaxlib", "ml_dtypes", "builtins")


def _own(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module.split(".")[0] in _DIGEST_MODULES


def _feed(h: Any, v: Any) -> None:
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
        h.update(f"{type(v).__name__}:{v!r};".encode())
    elif isinstance(v, (np.ndarray, np.generic, jax.Array)):
        a = np.ascontiguousarray(np.asarray(v))
        if a.dtype.kind == "O":
            raise _Undigestible("an object array")
        h.update(f"array:{a.dtype.str}:{a.dtype.name}:{a.shape};".encode())
        h.update(a.tobytes())
    elif isinstance(v, np.dtype):
        h.update(f"dtype:{v.name};".encode())
    elif isinstance(v, type):
        if not _own(v):
            raise _Undigestible(f"{v.__module__}.{v.__qualname__}")
        h.update(f"class:{v.__module__}.{v.__qualname__};".encode())
    elif isinstance(v, enum.Enum):
        if not _own(type(v)):
            raise _Undigestible(repr(v))
        h.update(f"{type(v).__module__}.{type(v).__qualname__}:{v!r};".encode())
    elif isinstance(v, Mapping):
        h.update(f"map:{len(v)}{{".encode())
        for k, item in v.items():  # in their order: the trace follows it
            _feed(h, k)
            _feed(h, item)
        h.update(b"}")
    elif isinstance(v, (tuple, list)):
        h.update(f"{type(v).__name__}:{len(v)}(".encode())
        for item in v:
            _feed(h, item)
        h.update(b")")
    elif isinstance(v, (set, frozenset)):
        _feed(h, sorted(v, key=repr))
    elif dataclasses.is_dataclass(v) and _own(type(v)):
        h.update(f"{type(v).__module__}.{type(v).__qualname__}(".encode())
        for f in dataclasses.fields(v):
            h.update(f.name.encode())
            _feed(h, getattr(v, f.name))
        h.update(b")")
    else:
        raise _Undigestible(f"{type(v).__module__}.{type(v).__qualname__}")


def _program_digest(graph: Graph, *values: Any) -> str | None:
    """sha256 (hex) of what a program traced from ``graph`` and ``values`` computes: the
    graph's nodes, attributes, tensor types and constants, and ``values`` (weights, a
    quantization spec and state: pytrees of arrays, numbers, strings, enums and npujax's
    dataclasses), by their contents; None where one of them cannot be named so (a
    ``JaxPrimitive`` node's traced function, an operator whose JAX semantics are registered
    outside npujax, a class defined outside npujax): the program may then change between
    processes with the same digest.

    Args:
      graph: the model graph.
      values: the other inputs of the trace (pytrees).

    Returns:
      The digest, or None.
    """
    for op in {n.op for n in graph.nodes}:
        run = OPS[op].run if op in OPS else None
        if run is None or not _own(run):
            return None
    h = hashlib.sha256()
    try:
        _feed(h, (graph, values))
    except _Undigestible as e:
        _log.debug("not keeping the traced program: %s", e)
        return None
    return h.hexdigest()


def _check_real_weights(graph: Graph, params: Params) -> None:
    """Refuse a graph imported for its shapes only, or params without values."""
    if graph.source == SHAPES_ONLY_SOURCE:
        raise GraphError("this graph was imported for its shapes only (its ONNX external-data "
                         "files were missing, so its weights have no values); place the data files "
                         "next to the model and import it again to execute it.")
    if any_absent(params):
        raise GraphError("these params hold weights known by their shapes only (traced or "
                         "imported without their values, npujax.ir.absent): a model is "
                         "executed with its real weights; trace or import it with them.")


def _run_fixed(graph: Graph, params: Params, quant: Any, qstate: Any, x: Any) -> Any:
    with forward_only():
        return execute(graph, params, x, quant=quant, qstate=qstate)


def _run_passed(graph: Graph, quant: Any, weights: tuple[Params, Any], x: Any) -> Any:
    with forward_only():
        return execute(graph, weights[0], x, quant=quant, qstate=weights[1])


def check_run(graph: Graph, batch: int) -> None:
    """Refuse a run of ``graph`` on ``batch`` examples whose inputs or node outputs would not
    fit ``max_tensor_bytes`` (:mod:`npujax.limits`), before anything is allocated.

    A model's *declared* shapes only have to stay under ``max_tensor_elements`` (``lower``
    computes with them and allocates nothing), but a run materializes every activation: a
    model declaring a 1x3x100000x100000 input, or resizing a small one to that size, is
    costed by ``lower`` and refused here with the tensor named, instead of dying in the
    allocator. Declared shapes carry the traced batch (the first input's leading dimension);
    a run of ``batch`` examples scales them by ``ceil(batch / traced batch)``.

    Raises:
      LimitError: the first tensor over the limit, with its shape at ``batch``.
    """
    lead = graph.tensors[graph.inputs[0]].shape[:1] if graph.inputs else ()
    traced = max(int(lead[0]), 1) if lead else 1
    scale = max(-(-max(batch, 1) // traced), 1)
    for name in [*graph.inputs, *(t for n in graph.nodes for t in n.outputs)]:
        t = graph.tensors.get(name)
        if t is None:
            continue
        itemsize = _ITEMSIZE.get(t.dtype, 8)
        nbytes = t.size * itemsize * scale
        if nbytes > get_limits().max_tensor_bytes:
            shape = [d * scale if i == 0 else d for i, d in enumerate(t.shape)] or [scale]
            check_bytes(nbytes, f"running the model on {batch} example(s) materializes tensor "
                        f"{name!r} ({t.dtype} {shape}), which")


#: Bytes per element of the graph's dtype names (unknown ones count 8).
_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
             "int16": 2, "int8": 1, "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1,
             "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


def _flattened_by_consumer(graph: Graph) -> set[str]:
    """The grouped Conv nodes whose output, through elementwise nodes only, is read by 1x1
    Convs and nothing else: XLA fuses those elementwise nodes into the convolution and flattens
    its output for the 1x1 Convs' matrix products, and a depthwise convolution then computes
    on flattened rows (:mod:`npujax.ops.gemm`)."""
    readers: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for t in node.inputs:
            readers.setdefault(t, []).append(node)
    outputs = set(graph.outputs)

    def pointwise(n: Node) -> bool:
        k = list(n.attrs.get("kernel_shape", ()))[2:]
        return (n.op == "Conv" and int(n.attrs.get("groups", 1)) == 1 and bool(k)
                and all(d == 1 for d in k) and all(int(v) == 1 for v in n.attrs["strides"]))

    found = set()
    for node in graph.nodes:
        if node.op != "Conv" or int(node.attrs.get("groups", 1)) == 1:
            continue
        todo, seen, ok, exits = [node.outputs[0]], set(), True, 0
        while todo and ok:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            ok = t not in outputs and bool(readers.get(t))
            for r in readers.get(t, []):
                if r.op in OPS and OPS[r.op].cost == "elementwise":
                    todo.extend(r.outputs)
                elif pointwise(r):
                    exits += 1
                else:
                    ok = False
        if ok and exits:
            found.add(node.name)
    return found


#: Operators that only move their first input's elements (the other inputs, if any, are
#: shapes or axes): a scale commutes with them.
_MOVES_ONLY = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"})


def _mean_scaled_by_consumer(graph: Graph, quant: Mapping[str, Any]) -> dict[str, str | None]:
    """GlobalAveragePool nodes whose output, through reshapes and transposes only, is read by
    Convs and Gemms (none quantized) and nothing else: ``{pool: None, consumer: the pool's
    input tensor}``.

    :func:`inference` runs such a pool as a sum (``attrs["sum_only"]``) and has its consumers
    scale their products by ``1 / (H x W)`` before the bias (``attrs["output_scale"]``): the
    same values up to float rounding, as the products are linear. XLA:CPU then fuses the scale
    into the consumer's bias and activation, where a mean took a loop kernel of its own between
    the pool (a YNNPACK reduction) and the product: one kernel fewer per squeeze-and-excitation
    block, each about 15 ms of compilation."""
    readers: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for t in node.inputs:
            readers.setdefault(t, []).append(node)
    outputs = set(graph.outputs)

    def linear(n: Node, t: str) -> bool:  # reads t as its only activation, scales with it
        return (n.op in ("Conv", "Gemm") and n.name not in quant
                and list(n.inputs) == [t])

    found: dict[str, str | None] = {}
    for node in graph.nodes:
        out = node.outputs[0] if node.outputs else None
        if (node.op != "GlobalAveragePool" or node.name in quant or out is None
                or not str(graph.tensors[out].dtype).startswith(("float", "bfloat"))):
            continue
        todo, consumers, ok = [out], [], True
        while todo and ok:
            t = todo.pop()
            ok = t not in outputs and bool(readers.get(t))
            for r in readers.get(t, []):
                if r.op in _MOVES_ONLY and r.inputs[0] == t and t not in r.inputs[1:]:
                    todo.extend(r.outputs)
                elif linear(r, t):
                    consumers.append(r.name)
                else:
                    ok = False
        if ok and consumers:
            found[node.name] = None
            found.update((c, node.inputs[0]) for c in consumers)
    return found


def _batchnorm_inv_std(graph: Graph, params: Params) -> dict[str, jax.Array]:
    """``rsqrt(var + epsilon)`` of every BatchNormalization node, computed in one concatenated
    operation and split (a model imported without ``optimize`` has dozens of them; XLA:CPU ran
    each as its own kernel, about 20 % of a small CNN's forward pass). The same operations per
    element as the per-node form, so the same values."""
    nodes = [n for n in graph.nodes if n.op == "BatchNormalization"
             and "var" in params.get(n.name, {}) and jnp.ndim(params[n.name]["var"]) == 1]
    if len(nodes) < 2:
        return {}
    var = [jnp.asarray(params[n.name]["var"]) for n in nodes]
    if len({v.dtype for v in var}) != 1:
        return {}
    # epsilon as one constant vector: concatenating per-node sums would cost a kernel each
    eps = np.concatenate([np.full(v.shape[0], n.attrs["epsilon"], v.dtype)
                          for n, v in zip(nodes, var)])
    inv = jax.lax.rsqrt(jnp.concatenate(var) + eps)
    splits = np.cumsum([v.shape[0] for v in var])[:-1]
    return dict(zip((n.name for n in nodes), jnp.split(inv, splits)))


def _batch_folded(graph: Graph) -> bool:
    """Whether ``graph`` was specialised to batch 1 with the batch folded into a shape (an
    imported ``x.reshape(x.shape[0], -1)`` becomes a Reshape to ``[1, -1]``). (A constant
    concatenated with activations is broadcast instead: :func:`_folded_concat_input`.)"""
    if not graph.inputs or graph.tensors[graph.inputs[0]].shape[:1] != (1,):
        return False
    return any(n.op == "Reshape" and n.attrs.get("shape") and n.attrs["shape"][0] not in (0, -1)
               for n in graph.nodes)


def _folded_concat_input(graph: Graph, node: Any, t: str, v: jax.Array, batch: int) -> jax.Array:
    """A batch-1 constant concatenated with activations along a non-batch axis (a ViT's class
    token, broadcast to the traced batch 1 and folded), broadcast to ``batch``."""
    if (node.op != "Concat" or t not in graph.constants or batch == 1 or not v.ndim
            or v.shape[0] != 1 or node.attrs.get("axis", 0) % v.ndim == 0):
        return v
    return jnp.broadcast_to(v, (batch, *v.shape[1:]))


def _execute_per_example(graph: Graph, params: Params, xs: list[jax.Array], *,
                         observe: Observe | None, **kw: Any) -> Any:
    """Run a batch-1 graph on a batch by mapping over examples (``jax.vmap``; one program).
    A ``jax.tree_util.Partial`` hook's arguments are mapped with the examples."""

    def one(xi, hook):
        if isinstance(hook, jax.tree_util.Partial):
            hook = jax.tree.map(lambda v: v[None], hook)
        return execute(graph, params, [v[None] for v in xi], observe=hook, **kw)

    if isinstance(observe, jax.tree_util.Partial):
        out = jax.vmap(one)(xs, observe)
    else:
        out = jax.vmap(lambda xi: one(xi, observe))(xs)
    return jax.tree.map(lambda a: a.reshape(a.shape[0], *a.shape[2:]), out)
