"""The operator registry: one :class:`OpDef` per Graph operator, the single source of op knowledge.

An operator's definition says everything the pipeline needs to know about it:

* ``run`` -- its JAX semantics (``fn(node, inputs, params) -> outputs``; ONNX semantics where
  the op has an ONNX name), used by :func:`npujax.execute`, the importers' shape inference and
  the integer path for operators that run in float;
* ``cost`` -- its class in the NPU cost model (:mod:`npujax.plan`): ``array`` (a GEMM on the MAC
  array, with ``array_work`` giving its im2col extents), ``elementwise`` (vector unit, fusible into
  the producing GEMM's output stage), ``vector`` (vector unit), ``free`` (relabels a buffer) or
  ``host`` (no NPU model: always the host CPU); ``vector_work`` splits a vector or elementwise
  op's work into ALU operations and special-function evaluations (exp, erf, tanh, reciprocal,
  rsqrt), which the vector unit's special-function unit runs at its own rate;
* ``export`` -- how :func:`npujax.to_onnx` writes it (``fn(writer, node)``);
* ``codes`` / ``run_codes`` -- whether the integer path (:mod:`npujax.backends.integer`) runs it
  on integer codes (``"exact"``: commutes with quantization; ``"rounding"``: rounds once);
* kernel axes and ``quantized`` for the operators whose weights the quantization schemes
  quantize, ``epilogue`` for activations a GEMM's output stage can apply, ``jax_primitives``
  for the JAX primitives the Flax tracer maps 1:1 onto the op.

ONNX importers are registered separately (:func:`onnx_importer`), keyed by the ONNX operator
type, because one ONNX operator may become several Graph operators (ONNX ``MatMul`` by a
constant is a ``Gemm``). Each op family lives in one module of :mod:`npujax.ops`; the package
imports every module, so a new operator is one new file.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import jax
import jax.numpy as jnp

from npujax.errors import UnsupportedOpError

if TYPE_CHECKING:
    from npujax.ir.graph import Graph, Node
    from npujax.numerics.fixed_point import QTensor

__all__ = [
    "OpDef", "ArrayWork", "VectorWork", "CostClass", "OPS", "ONNX_IMPORTERS", "ONNX_WEIGHT_OPS",
    "ONNX_DOMAIN_IMPORTERS",
    "register", "onnx_importer", "get_op", "run_op", "widen", "NARROW_FLOATS", "gemm_nodes",
    "quantized_ops",
    "operand_quantized_ops", "quantizable_nodes",
    "kernel_out_axis", "kernel_in_axis", "out_channel_view", "apply_epilogue", "epilogue_ops",
    "ops_with", "forward_only", "is_forward_only",
]

_FORWARD_ONLY = contextvars.ContextVar("npujax_forward_only", default=False)


@contextlib.contextmanager
def forward_only() -> Iterator[None]:
    """Trace the operators for a forward pass that is never differentiated
    (:func:`npujax.ir.execute.inference`): kernels may then take forms whose gradients would
    differ from their reference form's (MaxPool as a maximum of strided slices splits the
    gradient of a tie, ``lax.reduce_window`` gives it to one element), or that XLA:CPU compiles
    into fewer kernels (a product of one vector as a two-row product, a Softmax over a short
    axis pairwise; :mod:`npujax.ops.gemm`, :mod:`npujax.ops.activation`). Values are the same
    up to float rounding; training and calibration trace the reference forms."""
    token = _FORWARD_ONLY.set(True)
    try:
        yield
    finally:
        _FORWARD_ONLY.reset(token)


def is_forward_only() -> bool:
    """Whether the operators are being traced under :func:`forward_only`."""
    return _FORWARD_ONLY.get()


#: Cost classes of the NPU model (see the module docstring).
CostClass = Literal["array", "elementwise", "vector", "free", "host"]

#: ``fn(node, inputs, params) -> outputs``: ``inputs`` are the arrays named by ``node.inputs``,
#: ``params`` is ``params[node.name]`` (possibly fake-quantized already).
OpFn = Callable[["Node", Sequence[jax.Array], Mapping[str, jax.Array]], list[jax.Array]]
Shape = tuple[int, ...]


class ArrayWork(NamedTuple):
    """The GEMM an ``array`` operator runs: ``groups`` GEMMs of ``[M, K] x [K, N]`` after im2col
    and channel padding, its true MACs, and the weight and (int32) bias elements it reads."""

    M: int
    K: int
    N: int
    groups: int
    macs: int
    weight_elems: int
    bias_elems: int


class VectorWork(NamedTuple):
    """The work of a ``vector`` or ``elementwise`` operator on the vector unit.

    Attributes:
      alu_ops: simple element operations (add, multiply, max, compare, data movement), one lane
        cycle each.
      special_ops: special-function evaluations (exp, erf, tanh, reciprocal, rsqrt), each
        ``NpuSpec.vector.special_cycles_per_elem`` lane cycles.
    """

    alu_ops: int
    special_ops: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpDef:
    """Everything npujax knows about one Graph operator (see the module docstring).

    Attributes:
      name: the operator name (ONNX spelling where one exists).
      run: JAX implementation, ``fn(node, inputs, params) -> list of outputs``.
      cost: cost class in the NPU model.
      export: ONNX export, ``fn(writer, node)`` (see :mod:`npujax.backends.onnx_export`); None
        when the op cannot be exported.
      unary: for pure unary elementwise ops, the function of one array (the epilogue form).
      epilogue: whether :func:`npujax.ir.fuse_epilogues` may fuse it into a GEMM's output stage.
      codes: ``"exact"`` if the op acts on integer codes exactly (data movement, max, ReLU),
        ``"rounding"`` if it does with one rounding (average pooling); None otherwise.
      run_codes: the code-level implementation, ``fn(node, qtensor) -> qtensor``; None runs
        ``run`` on the codes (data movement).
      array_work: for ``array`` ops, ``fn(node, input_shapes, output_shapes, align) -> ArrayWork``
        with channels padded to multiples of ``align``.
      vector_work: for ``vector``/``elementwise`` ops, ``fn(node, input_shapes, output_shapes)
        -> VectorWork``; None: one ALU operation per output element (per window element for
        pooling).
      kernel_out_axis, kernel_in_axis: for ops with a ``kernel`` parameter, ``fn(node) -> axis``
        of its output channels (per-channel quantization) and input channels (per-block).
      channel_view: for kernels without a single output-channel axis, ``fn(node, kernel) ->
        (view, axis, back)`` (see :func:`out_channel_view`).
      quantized: the standard schemes (:func:`npujax.quant_spec`, rules) quantize its kernel and
        input activation.
      quantized_operands: the standard schemes quantize both of its activation operands (a
        MatMul or Einsum of two activations: attention's ``Q K^T`` and ``P V``), each per
        tensor on a calibrated grid; the second is the array's stationary operand and takes the
        layer's weight format.
      jax_primitives: JAX primitives the Flax tracer maps onto this op one to one.
      batch_dependent: its attributes may depend on the batch size (``rebatch`` refuses).
      integers: ``run`` has ONNX's exact semantics on integer tensors (dtype kept, division
        truncating toward zero, wrap-around); the ONNX importer refuses an op without it on an
        integer tensor computed at run time (shapes and constants are folded exactly).
      index_inputs: positions of inputs that hold indices into another operand (Gather's
        ``indices``): a 64-bit one may run as 32 bits without x64, exactly, because an index is
        bounded by a dimension, and dimensions are below 2**31 (the importer's size limits).
    """

    name: str
    run: OpFn
    cost: CostClass
    export: Callable[[Any, Node], None] | None = None
    unary: Callable[[jax.Array], jax.Array] | None = None
    epilogue: bool = False
    codes: Literal["exact", "rounding"] | None = None
    run_codes: Callable[[Node, QTensor], QTensor] | None = None
    array_work: Callable[[Node, Sequence[Shape], Sequence[Shape], int], ArrayWork] | None = None
    vector_work: Callable[[Node, Sequence[Shape], Sequence[Shape]], VectorWork] | None = None
    kernel_out_axis: Callable[[Node], int] | None = None
    kernel_in_axis: Callable[[Node], int] | None = None
    channel_view: Callable[[Node, Any], tuple[Any, int, Callable[[Any], Any]]] | None = None
    quantized: bool = False
    quantized_operands: bool = False
    weight_role: str = "kernel"
    jax_primitives: tuple[str, ...] = ()
    batch_dependent: bool = False
    integers: bool = False
    index_inputs: tuple[int, ...] = ()


#: Every registered operator by name.
OPS: dict[str, OpDef] = {}
#: ONNX importers by ONNX operator type: ``fn(ctx, onnx_node, attrs)``.
ONNX_IMPORTERS: dict[str, Callable[..., None]] = {}
#: ONNX operator types whose constant inputs are weights (kept as params, never folded).
ONNX_WEIGHT_OPS: set[str] = set()
#: Importers of operators of other domains (onnxruntime's ``com.microsoft`` contrib operators)
#: by ``(domain, operator type)``; such nodes are never folded.
ONNX_DOMAIN_IMPORTERS: dict[tuple[str, str], Callable[..., None]] = {}


def register(*defs: OpDef) -> None:
    """Add operator definitions to :data:`OPS` (a name may be registered once)."""
    for d in defs:
        if d.name in OPS:
            raise ValueError(f"operator {d.name!r} is registered twice.")
        if d.cost == "array" and d.array_work is None:
            raise ValueError(f"array operator {d.name!r} needs array_work.")
        OPS[d.name] = d


def onnx_importer(*onnx_types: str, weights: bool = False, domain: str = "") -> Callable:
    """Decorator registering an ONNX importer for ``onnx_types`` (of the default domain, or of
    ``domain``, e.g. ``"com.microsoft"``: :data:`ONNX_DOMAIN_IMPORTERS`).

    ``weights=True``: the operator's constant inputs are weights, kept as params rather than
    folded into constants.
    """

    def deco(fn: Callable[..., None]) -> Callable[..., None]:
        if domain:
            for t in onnx_types:
                if (domain, t) in ONNX_DOMAIN_IMPORTERS:
                    raise ValueError(f"ONNX operator {domain}.{t} has two importers.")
                ONNX_DOMAIN_IMPORTERS[domain, t] = fn
            return fn
        for t in onnx_types:
            if t in ONNX_IMPORTERS:
                raise ValueError(f"ONNX operator {t!r} has two importers.")
            ONNX_IMPORTERS[t] = fn
            if weights:
                ONNX_WEIGHT_OPS.add(t)
        return fn

    return deco


def get_op(name: str, node: str | None = None) -> OpDef:
    """The definition of operator ``name``.

    Raises:
      UnsupportedOpError: unknown operator (names the node when given, lists the known ones).
    """
    d = OPS.get(name)
    if d is None:
        where = f"node {node!r} has operator {name!r}" if node else f"operator {name!r}"
        raise UnsupportedOpError(f"{where}, which npujax cannot execute; supported operators: "
                                 f"{sorted(OPS)}.")
    return d


#: Floating types a graph carries between operators but no operator computes in: inputs of
#: these types are widened to float32 (exactly) and the outputs rounded back to the declared
#: type once (:func:`run_op`).
NARROW_FLOATS = frozenset({"float16", "bfloat16"})


def widen(x: jax.Array) -> jax.Array:
    """``x`` as float32 if it is a 16-bit float (:data:`NARROW_FLOATS`; exact), else as is."""
    return x.astype(jnp.float32) if str(x.dtype) in NARROW_FLOATS else x


def run_op(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array],
           out_dtypes: Sequence[Any] | None = None) -> list[jax.Array]:
    """Run one node with its operator's JAX implementation.

    Every operator computes in float32 or wider: 16-bit float inputs (:data:`NARROW_FLOATS`)
    are widened to float32, and with ``out_dtypes`` (the graph's declared output types) each
    floating output is cast to its declared type, so an op keeps the output dtype of its
    ONNX node (a bfloat16 Einsum gives bfloat16, rounded once from a float32 accumulation, as
    ONNX's reference computes it).

    Raises:
      UnsupportedOpError: the node's operator is not registered.
    """
    outs = get_op(node.op, node.name).run(node, [widen(v) for v in inputs], params)
    if out_dtypes is None:
        return outs
    want = [None if d is None else jax.dtypes.canonicalize_dtype(d) for d in out_dtypes]
    return [o.astype(d) if (d is not None and jnp.issubdtype(o.dtype, jnp.floating)
                            and jnp.issubdtype(d, jnp.floating) and o.dtype != d) else o
            for o, d in zip(outs, want)]


def quantized_ops() -> frozenset[str]:
    """Operators whose kernels and inputs the standard quantization schemes quantize."""
    return frozenset(n for n, d in OPS.items() if d.quantized)


def gemm_nodes(graph: Graph) -> list[Node]:
    """The graph's quantizable GEMM layers with a weight kernel (Conv, Gemm), in graph order."""
    q = quantized_ops()
    return [n for n in graph.nodes if n.op in q]


def embedding_nodes(graph: Graph) -> list[Node]:
    """The graph's embedding lookups, in graph order: Gather nodes that read a parameter table
    (role ``table``, e.g. a traced ``nnx.Embed``), whose tables a spec may quantize weight-only
    (``quant_spec(..., embedding_bits=b)``)."""
    return [n for n in graph.nodes
            if OPS.get(n.op) is not None and OPS[n.op].weight_role == "table"
            and "table" in n.params]


def weight_role(node: Node) -> str:
    """The param role of a quantized layer's weight: ``"kernel"`` (Conv, Gemm, ...) or
    ``"table"`` (an embedding Gather)."""
    d = OPS.get(node.op)
    return d.weight_role if d is not None else "kernel"


def operand_quantized_ops() -> frozenset[str]:
    """Operators of two activations whose operands the standard schemes quantize (MatMul,
    Einsum)."""
    return frozenset(n for n, d in OPS.items() if d.quantized_operands)


def quantizable_nodes(graph: Graph) -> list[Node]:
    """Every layer the standard schemes quantize, in graph order: the GEMMs with a kernel
    (:func:`gemm_nodes`) and the GEMMs of two activations (attention's ``Q K^T``, ``P V``)."""
    q = quantized_ops() | operand_quantized_ops()
    return [n for n in graph.nodes if n.op in q]


def epilogue_ops() -> frozenset[str]:
    """Activations a GEMM's output stage may apply (fused by :func:`npujax.ir.fuse_epilogues`)."""
    return frozenset(n for n, d in OPS.items() if d.epilogue)


def apply_epilogue(node: Node, y: jax.Array) -> jax.Array:
    """Apply the activations fused into a GEMM node (``attrs['epilogue']``), in order."""
    for op in node.attrs.get("epilogue", ()):
        fn = OPS[op].unary
        assert fn is not None, op
        y = fn(y)
    return y


def _weighted(node: Node) -> OpDef:
    d = get_op(node.op, node.name)
    if d.kernel_out_axis is None or d.kernel_in_axis is None:
        raise UnsupportedOpError(f"node {node.name!r} ({node.op}) has no weight kernel.")
    return d


def kernel_out_axis(node: Node) -> int:
    """Axis of the output channels in a node's ``kernel`` (the per-channel quantization axis).

    Raises:
      QuantizationError: for a kernel without a single output-channel axis (a grouped
        ConvTranspose; use :func:`out_channel_view`).
      UnsupportedOpError: for a node without a weight kernel.
    """
    fn = _weighted(node).kernel_out_axis
    assert fn is not None
    return fn(node)


def kernel_in_axis(node: Node) -> int:
    """Axis of the input channels in a node's ``kernel`` (the per-block quantization axis).

    Raises:
      UnsupportedOpError: for a node without a weight kernel.
    """
    fn = _weighted(node).kernel_in_axis
    assert fn is not None
    return fn(node)


def out_channel_view(node: Node, kernel: Any) -> tuple[Any, int, Callable[[Any], Any]]:
    """The kernel seen with its output channels on one axis, that axis, and the map back.

    Per-channel quantization needs one scale per output channel. For most kernels that is one
    axis (:func:`kernel_out_axis`) and the view is the kernel itself; an operator whose kernel
    has no such axis (a grouped ConvTranspose) defines ``channel_view``.

    Args:
      node: a node with a weight kernel.
      kernel: its kernel (numpy or JAX array).

    Returns:
      ``(view, axis, back)`` with ``back(view) == kernel``.
    """
    d = _weighted(node)
    if d.channel_view is not None:
        return d.channel_view(node, kernel)
    return kernel, kernel_out_axis(node), lambda v: v


def ops_with(cost: Iterable[str]) -> frozenset[str]:
    """Names of the operators of the given cost classes."""
    want = set(cost)
    return frozenset(n for n, d in OPS.items() if d.cost in want)
