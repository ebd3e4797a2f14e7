"""QAT inside the user's own Flax training loop: a quantized model that *is* a Flax model.

``qmodel = quantize_model(model, rules, sample_input)`` traces ``model`` once
(:func:`npujax.trace_flax`), folds BatchNorm and fuses activations as the NPU compiler does
(:func:`npujax.optimize`), quantizes the layers the rules name and returns a
:class:`QuantizedModel`, an ``nnx.Module`` with the model's call signature (``qmodel(x)``) that
runs that one graph with fake-quant (:func:`npujax.execute`).

**Variables are shared, not copied.** ``qmodel.model`` *is* the user's module: every call reads
the current values of its ``nnx.Param`` / ``nnx.BatchStat`` variables, folds BatchNorm on the fly
(running statistics frozen, gradients through the kernel and the BN scale/shift; Krishnamoorthi
2018, arXiv:1806.08342, section 3.2) and fake-quantizes. So ``nnx.Optimizer(qmodel, tx,
wrt=nnx.Param)`` with any optax transform, ``nnx.jit``, ``nnx.value_and_grad`` and orbax
checkpointing of ``nnx.state(qmodel)`` work unchanged, and after training the original module
already holds the trained weights (:func:`write_back` is then a no-op; it copies only into
another instance). The quantizer state lives beside the model: the calibrated grids in a
:class:`QuantState` variable (not trained), the fields a quantizer learns (LSQ steps) in a
:class:`QuantParam` (an ``nnx.Param``, so the user's optimizer trains them).

What is shared is what the graph's layers read (kernels, biases, norm scales, embedding tables;
a kernel stored in another shape, such as ``nnx.MultiHeadAttention``'s ``(in, heads,
head_dim)``, is reshaped as the tracer did). A parameter used in plain arithmetic rather than
through a layer (a ViT's class token and position embedding) is folded by the tracer into a
graph constant: the quantized model keeps it at its traced value and QAT does not train it
(``quantize_model`` logs a warning naming such parameters).

Linen has no module objects holding variables, so the same function with ``variables=`` returns
``(qmodule, qvariables)``: a Linen module whose ``apply(qvariables, x)`` runs the graph on the
variables' ``params`` / ``batch_stats`` (the user's own trees) and the quantizer state kept in a
``"quant"`` collection (learned fields under ``params["npujax_quant"]``).

Numbers: one forward pass and one optimizer step equal :func:`npujax.execute` and
:func:`npujax.train_graph` (``TrainConfig(fold_bn=True)``, same optax transform) on the same graph
(``tests/quantize/test_flax_model.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.typing import ArrayLike

from npujax.calib import Observer, minmax_observer
from npujax.errors import ConfigError, GraphError
from npujax.frontends.flax import trace_flax
from npujax.ir.execute import execute
from npujax.ir.graph import Graph, Params
from npujax.ir.passes import fold_batchnorm, frozen_bn_stats, fuse_epilogues
from npujax.quantize.calibrate import calibrate
from npujax.quantize.quantizers import merge_learned, split_learned
from npujax.quantize.rules import QuantRule, quant_spec_from_rules
from npujax.quantize.spec import LayerQuant, QuantSpec

__all__ = ["QuantizedModel", "QuantState", "QuantParam", "quantize_model",
           "calibrate_model", "graph_of", "write_back"]

Rules = Sequence[QuantRule | object] | QuantSpec

log = logging.getLogger(__name__)

#: Graph param roles whose Flax variable has another name (``nnx.Embed.embedding``).
_VARIABLE_NAME = {"table": "embedding"}


class QuantState(nnx.Variable):
    """The calibrated quantizer state ``{layer: state}`` of a :class:`QuantizedModel` (not
    trained; checkpointed with the model)."""


class QuantParam(nnx.Param):
    """The quantizer fields QAT learns (``{layer: {field: array}}``, e.g. LSQ steps): an
    ``nnx.Param``, so ``nnx.Optimizer(qmodel, tx, wrt=nnx.Param)`` trains them."""


@dataclasses.dataclass(frozen=True, eq=False)
class _Plan:
    """What a quantized model runs (static; compared by identity, so ``nnx.jit`` caches on it).

    Attributes:
      graph: the traced graph (BatchNorm unfolded).
      run_graph: the graph that runs: BN folded, activations fused.
      quant: the QuantSpec of ``run_graph``.
      refs: ``{node: {role: variable path}}`` into the user's model (NNX: attribute path; Linen:
        ``(collection, *path)``).
      shapes: ``{node: {role: shape}}`` of the traced params: a variable of another shape and
        the same size is reshaped (row-major) to it, as the tracer did (the ``(in, heads,
        head_dim)`` kernels of ``nnx.MultiHeadAttention`` run as ``(in, heads * head_dim)``).
    """

    graph: Graph
    run_graph: Graph
    quant: Mapping[str, LayerQuant]
    refs: Mapping[str, Mapping[str, tuple[Any, ...]]]
    shapes: Mapping[str, Mapping[str, tuple[int, ...]]] = dataclasses.field(
        default_factory=dict)

    def values(self, read: Callable[[tuple[Any, ...]], Any]) -> Params:
        """The current variable values as float32, in the variables' own shapes."""
        return {node: {role: jnp.asarray(read(path), jnp.float32) for role, path in roles.items()}
                for node, roles in self.refs.items()}

    def shaped(self, values: Params) -> Params:
        """``values`` reshaped (row-major) to the traced shapes."""
        out: Params = {}
        for node, roles in values.items():
            out[node] = {}
            for role, v in roles.items():
                shape = self.shapes.get(node, {}).get(role, v.shape)
                out[node][role] = v if v.shape == shape else v.reshape(shape)
        return out

    def fold(self, raw: Params) -> Params:
        """The run graph's params (BN folded, statistics gradient-stopped)."""
        return fold_batchnorm(self.graph, frozen_bn_stats(self.graph, raw))[1]

    def params(self, read: Callable[[tuple[Any, ...]], Any]) -> Params:
        """The run graph's params from the current variable values."""
        return self._jit_fold(self.values(read))

    def forward(self, read: Callable[[tuple[Any, ...]], Any], x: jax.Array, qstate: Any) -> Any:
        """The quantized graph's output: reshape, fold and execute, as one compiled program
        (eager calls are as fast as jitted ones; inside ``nnx.jit`` it inlines). The reshapes
        run inside it: eagerly each kernel shape compiled a program of its own."""
        return self._jit_forward(self.values(read), x, qstate)

    @functools.cached_property
    def _jit_fold(self) -> Callable[[Params], Params]:
        return jax.jit(lambda values: self.fold(self.shaped(values)))

    @functools.cached_property
    def _jit_forward(self) -> Callable[..., Any]:
        def run(values, x, qstate):
            return execute(self.run_graph, self.fold(self.shaped(values)), x, quant=self.quant,
                           qstate=qstate)

        return jax.jit(run)


def _node_paths(graph: Graph, paths: set[str]) -> dict[str, str]:
    """The module path of every node with params (a layer called twice is ``path_k``)."""
    out = {}
    for n in graph.nodes:
        if not n.params:
            continue
        base = n.name
        if base not in paths and "_" in base and base.rsplit("_", 1)[1].isdigit():
            base = base.rsplit("_", 1)[0]
        if base not in paths:
            raise GraphError(f"traced layer {n.name!r} matches no module of the model "
                             f"(modules: {sorted(paths)}); please report the model.")
        out[n.name] = base
    return out


def _plan(graph: Graph, params: Params, rules: Rules,
          path_of: Callable[[str, str], tuple[Any, ...]], paths: set[str]) -> _Plan:
    folded_graph, folded = fold_batchnorm(graph, params)
    run_graph = fuse_epilogues(folded_graph, folded)[0]
    quant = dict(rules) if isinstance(rules, Mapping) else quant_spec_from_rules(run_graph, rules)
    node_paths = _node_paths(graph, paths)
    refs = {name: {role: path_of(node_paths[name], role) for role in params[name]}
            for name in node_paths}
    shapes = {name: {role: tuple(jnp.shape(v)) for role, v in params[name].items()}
              for name in node_paths}
    return _Plan(graph, run_graph, quant, refs, shapes)


def _check_shared(plan: _Plan, params: Params, read: Callable[[tuple[Any, ...]], Any]) -> None:
    """The traced params must be the model's variables (reshaped at most).

    Raises:
      GraphError: a traced param that is not its variable's value (names both), e.g. a kernel
        the tracer transposed: the quantized model could not share it.
    """
    values = plan.values(read)  # compared on the host (reshaping eagerly compiles per shape)
    for node, roles in params.items():
        for role, v in roles.items():
            got, want = np.asarray(values.get(node, {}).get(role, v)), np.asarray(v)
            if got.size != want.size or not np.array_equal(got.reshape(want.shape), want):
                raise GraphError(
                    f"traced layer {node!r} {role} is not the value of the model's variable "
                    f"{'/'.join(map(str, plan.refs[node][role]))} (shape "
                    f"{tuple(jnp.shape(v))}); quantize_model cannot share it. Please report the "
                    "model.")


def _warn_unshared(plan: _Plan, param_paths: Iterable[tuple[Any, ...]], strip: int) -> None:
    """Name the model's parameters the quantized model does not read (folded into graph
    constants by the tracer): QAT keeps them at their traced values, so the user's optimizer
    gets zero gradients for them. ``strip`` leading path entries of ``plan.refs`` (Linen: the
    ``"params"`` collection) are not in ``param_paths``."""
    shared = {tuple(str(p) for p in path[strip:])
              for roles in plan.refs.values() for path in roles.values()}
    frozen = sorted("/".join(str(p) for p in path) for path in param_paths
                    if tuple(str(p) for p in path) not in shared)
    if frozen:
        shown = ", ".join(frozen[:8]) + (f", +{len(frozen) - 8}" if len(frozen) > 8 else "")
        log.warning(f"quantize_model: {len(frozen)} parameter(s) of the model ({shown}) are "
                    "used outside a layer (plain arithmetic, e.g. a position embedding or class "
                    "token); the traced graph holds them as constants, so QAT does not train "
                    "them (their gradient is zero) and the quantized model keeps the values "
                    "they had when quantize_model traced it.")


def _as_input(x: ArrayLike) -> jax.Array:
    """A model input: floating point as float32, integers (token ids) and booleans kept."""
    if isinstance(x, jax.Array):
        return x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x
    # converted on the host and device_put: an eager conversion, and jnp.asarray of a numpy
    # array, compile a program per shape
    a = np.asarray(x)
    return jax.device_put(a.astype(np.float32) if np.issubdtype(a.dtype, np.floating) else a)


def _calibrated(plan: _Plan, params: Params, batches: Iterable[ArrayLike],
                observer: str | Callable[[], Observer]) -> tuple[dict, dict]:
    """``(learned, rest)`` of the calibrated qstate (see :func:`split_learned`)."""
    qstate = calibrate(plan.run_graph, params, batches, plan.quant, observer=observer)
    learned, full = split_learned(plan.quant, qstate)
    rest = {n: (s._replace(**{f: None for f in learned.get(n, {})})) for n, s in full.items()}
    return learned, rest


def _qstate(rest: Mapping[str, Any], learned: Mapping[str, Mapping[str, Any]]) -> dict:
    return merge_learned(learned, rest) if learned else dict(rest)


# ------------------------------------------------------------------------------------- NNX


class QuantizedModel(nnx.Module):
    """A Flax NNX model running its traced graph with fake-quant (see the module docstring).

    Attributes:
      model: the user's module (shared: its variables are the ones trained).
      qstate: the calibrated quantizer state (:class:`QuantState`).
      learned: the learned quantizer fields (:class:`QuantParam`; empty for STE layers).
    """

    def __init__(self, model: nnx.Module, plan: _Plan, rest: dict, learned: dict) -> None:
        self.model = model
        self.plan = plan
        self.qstate = QuantState(rest)
        self.learned = QuantParam(learned)

    def _read(self, path: tuple[Any, ...]) -> Any:
        obj: Any = self.model
        for p in path:
            obj = getattr(obj, p) if isinstance(p, str) and hasattr(obj, p) else obj[p]
        return obj.get_value() if isinstance(obj, nnx.Variable) else obj

    def folded_params(self) -> Params:
        """The run graph's params now: the model's variables with BatchNorm folded."""
        return self.plan.params(self._read)

    def current_qstate(self) -> dict[str, Any]:
        """The quantizer state now (calibrated grids and learned fields merged)."""
        return _qstate(self.qstate.get_value(), self.learned.get_value())

    def __call__(self, x: ArrayLike) -> Any:
        """The quantized model's output on ``x`` (the traced model's input shape, any batch)."""
        return self.plan.forward(self._read, _as_input(x), self.current_qstate())


def _nnx_paths(model: nnx.Module) -> dict[str, tuple[Any, ...]]:
    """``{module path: attribute path}`` of the model's modules; a model that is itself one
    layer (``nnx.Linear``) is traced under its class name and maps to the root ``()``."""
    paths = {"/".join(str(p) for p in path): tuple(path)
             for path, node in nnx.iter_graph(model) if isinstance(node, nnx.Module) and path}
    paths.setdefault(type(model).__name__, ())
    return paths


# ------------------------------------------------------------------------------------- Linen


def _linen_module_class() -> type:
    import flax.linen as nn

    class QuantizedLinenModule(nn.Module):
        """A Linen module running the traced graph with fake-quant on ``variables``."""

        plan: Any

        def __call__(self, x: ArrayLike) -> Any:
            v = self.variables

            def read(path):
                d: Any = v
                for p in path:
                    d = d[p]
                return d

            learned = v.get("params", {}).get("npujax_quant", {})
            qstate = _qstate(v.get("quant", {}).get("state", {}), learned)
            return self.plan.forward(read, _as_input(x), qstate)

    return QuantizedLinenModule


def _is_linen(model: Any) -> bool:
    return not isinstance(model, nnx.Module)


def _linen_variables(variables: Mapping, rest: dict, learned: dict) -> dict:
    out = {k: v for k, v in variables.items() if k != "quant"}
    params = {k: v for k, v in out.get("params", {}).items() if k != "npujax_quant"}
    if learned:
        params["npujax_quant"] = learned
    out["params"] = params
    out["quant"] = {"state": rest}
    return out


# ------------------------------------------------------------------------------------- API


def quantize_model(
    model: Any,
    rules: Rules,
    sample_input: ArrayLike,
    *,
    variables: Mapping | None = None,
    observer: str | Callable[[], Observer] = minmax_observer,
    **apply_kwargs: Any,
) -> Any:
    """A quantized Flax model for QAT in the user's own training loop.

    Args:
      model: an ``nnx.Module`` (shared, not copied: see the module docstring), or a
        ``flax.linen.Module`` with ``variables``.
      rules: :class:`npujax.QuantRule` list (npujax or Qwix vocabulary; Qwix ``QtRule`` objects
        too), or a ready :data:`npujax.QuantSpec` for the BN-folded graph.
      sample_input: ``(batch, ...)``, float (run as float32) or integer (token ids, kept): fixes
        the non-batch input shape (the model is traced on its first example; any batch runs
        later) and gives the initial activation ranges (re-calibrate on real data with
        :func:`calibrate_model`).
      variables: Linen only: ``{"params": ..., "batch_stats": ...}``.
      observer: activation observer of the initial calibration (see :func:`npujax.calibrate`).
      **apply_kwargs: Linen only: keyword arguments of ``apply`` for tracing (e.g.
        ``train=False``).

    Returns:
      NNX: a :class:`QuantizedModel` (``qmodel(x)`` as ``model(x)``). Linen: ``(qmodule,
      qvariables)``: ``qmodule.apply(qvariables, x)``, where ``qvariables`` holds the user's
      ``params`` / ``batch_stats`` (plus ``params["npujax_quant"]`` for learned quantizer fields)
      and a ``"quant"`` collection.

    Raises:
      ConfigError: a rule that matches no layer (names the layers); bad rule fields.
      GraphError, UnsupportedOpError: the model cannot be traced (see :func:`npujax.trace_flax`).

    Examples:
      >>> qmodel = npujax.quantize_model(model, [npujax.QuantRule(module_path=".*",
      ...     weight_qtype="int8", act_qtype="int8")], x[:8])                 # doctest: +SKIP
      >>> opt = nnx.Optimizer(qmodel, optax.adamw(1e-4), wrt=nnx.Param)      # doctest: +SKIP
    """
    x = _as_input(sample_input)
    if x.ndim == 0 or x.shape[0] < 1:
        raise ConfigError(f"sample_input must be a batch (batch, ...) of at least one example, "
                          f"got shape {tuple(x.shape)}.")
    # traced at batch 1: shapes that fold the batch run any batch (npujax.execute); sliced on
    # the host when the input is there (an eager slice compiles a program per shape)
    one = x[:1] if isinstance(sample_input, jax.Array) else \
        _as_input(np.asarray(sample_input)[:1])
    if _is_linen(model):
        if variables is None:
            raise ConfigError("quantize_model of a flax.linen.Module needs variables= (its "
                              "{'params': ..., 'batch_stats': ...}).")
        graph, params = trace_flax(model, one, variables=variables, **apply_kwargs)
        linen_paths = {n.name for n in graph.nodes if n.params}

        root = type(model).__name__  # the tracer's name of a layer that is the model itself

        def linen_path(path: str, role: str) -> tuple[Any, ...]:
            coll = "batch_stats" if role in ("mean", "var") else "params"
            keys = () if path == root and root not in variables.get(coll, {}) else \
                tuple(path.split("/"))
            return (coll, *keys, _VARIABLE_NAME.get(role, role))

        plan = _plan(graph, params, rules, linen_path,
                     linen_paths | {n.rsplit("_", 1)[0] for n in linen_paths})
        _check_shared(plan, params, lambda p: _dig(variables, p))
        _warn_unshared(plan, (tuple(getattr(k, "key", k) for k in path) for path, _ in
                              jax.tree_util.tree_flatten_with_path(
                                  variables.get("params", {}))[0]), 1)
        learned, rest = _calibrated(plan, plan.params(lambda p: _dig(variables, p)), [x],
                                    observer)
        return _linen_module_class()(plan=plan), _linen_variables(variables, rest, learned)
    if variables is not None or apply_kwargs:
        raise ConfigError("variables= and apply keyword arguments are for Linen models; an "
                          "nnx.Module holds its own variables.")
    graph, params = trace_flax(model, one)
    paths = _nnx_paths(model)
    plan = _plan(graph, params, rules,
                 lambda path, role: (*paths[path], _VARIABLE_NAME.get(role, role)), set(paths))
    qmodel = QuantizedModel(model, plan, {}, {})
    _check_shared(plan, params, qmodel._read)
    _warn_unshared(plan, (path for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))), 0)
    learned, rest = _calibrated(plan, qmodel.folded_params(), [x], observer)
    qmodel.qstate.set_value(rest)
    qmodel.learned.set_value(learned)
    return qmodel


def _dig(tree: Mapping, path: tuple[Any, ...]) -> Any:
    d: Any = tree
    for p in path:
        d = d[p]
    return d


def calibrate_model(
    qmodel: Any,
    batches: Iterable[ArrayLike],
    *,
    observer: str | Callable[[], Observer] = minmax_observer,
    variables: Mapping | None = None,
) -> Any:
    """Calibrate the static activation ranges of a quantized model on ``batches``.

    The float model (BN folded) is observed at every quantized layer's input; each layer's
    quantizer state is re-initialised from the observed range (LSQ: also its weight step).

    Args:
      qmodel: from :func:`quantize_model` (NNX), or the Linen module with ``variables``.
      batches: any iterable of input batches ``(batch, ...)`` float32 (a data loader), at least
        one.
      observer: ``"minmax"``, ``"ema"``, ``"percentile"``, ``"mse"``, ``"entropy"`` or a factory
        (see :func:`npujax.calibrate`).
      variables: Linen only: the quantized variables.

    Returns:
      NNX: ``qmodel`` (updated in place). Linen: the new quantized variables.

    Raises:
      CalibrationError: an empty iterator or batch, or NaN/inf at a layer.
      ConfigError: Linen without ``variables``.
    """
    if isinstance(qmodel, QuantizedModel):
        learned, rest = _calibrated(qmodel.plan, qmodel.folded_params(), batches, observer)
        qmodel.qstate.set_value(rest)
        qmodel.learned.set_value(learned)
        return qmodel
    plan = _linen_plan(qmodel, variables)
    assert variables is not None
    learned, rest = _calibrated(plan, plan.params(lambda p: _dig(variables, p)), batches,
                                observer)
    return _linen_variables(variables, rest, learned)


def _linen_plan(qmodel: Any, variables: Mapping | None) -> _Plan:
    plan = getattr(qmodel, "plan", None)
    if isinstance(qmodel, tuple) and len(qmodel) == 2 and isinstance(
            getattr(qmodel[0], "plan", None), _Plan):
        raise ConfigError("got the (qmodule, qvariables) pair that quantize_model returns for "
                          "a Linen module; pass its two parts: graph_of(qmodule, qvariables), "
                          "calibrate_model(qmodule, batches, variables=qvariables).")
    if not isinstance(plan, _Plan):
        raise ConfigError(f"expected a model from npujax.quantize_model, got "
                          f"{type(qmodel).__name__}.")
    if variables is None:
        raise ConfigError("a quantized Linen module needs variables= (the qvariables "
                          "quantize_model returned).")
    return plan


def graph_of(qmodel: Any, variables: Mapping | None = None
             ) -> tuple[Graph, Params, dict[str, Any]]:
    """``(graph, params, qstate)`` of a quantized model now, for :func:`npujax.lower`,
    :func:`npujax.search_precision`, :func:`npujax.to_onnx` or :func:`npujax.convert`.

    Args:
      qmodel: from :func:`quantize_model`.
      variables: Linen only: the quantized variables.

    Returns:
      The BN-folded, activation-fused graph; its float32 params (copies of the current
      weights, folded); the quantizer state (calibrated grids and learned fields). The spec is
      ``qmodel.plan.quant``.

    Raises:
      ConfigError: not a quantized model; Linen without ``variables``.
    """
    if isinstance(qmodel, QuantizedModel):
        return qmodel.plan.run_graph, qmodel.folded_params(), qmodel.current_qstate()
    plan = _linen_plan(qmodel, variables)
    assert variables is not None
    learned = variables.get("params", {}).get("npujax_quant", {})
    qstate = _qstate(variables.get("quant", {}).get("state", {}), learned)
    return plan.run_graph, plan.params(lambda p: _dig(variables, p)), qstate


def write_back(qmodel: Any, model: Any = None) -> Any:
    """The trained weights in the original (unfolded) model.

    NNX: ``qmodel.model`` is the user's module itself, so it already holds them: with ``model``
    None or that same module nothing is copied; another instance of the same class is updated in
    place (``nnx.update``). Linen: ``model`` is the quantized variables; returns the user's
    ``{"params", "batch_stats", ...}`` without npujax's additions.

    Returns:
      The model (NNX) or the plain variables (Linen).

    Raises:
      ConfigError: a model whose structure differs from the quantized one.
    """
    if isinstance(qmodel, QuantizedModel):
        if model is None or model is qmodel.model:
            return qmodel.model
        try:
            nnx.update(model, nnx.state(qmodel.model))
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"write_back: {type(model).__name__} does not have the structure "
                              f"of the quantized model's module ({e}).") from None
        return model
    if not isinstance(model, Mapping):
        raise ConfigError("write_back of a quantized Linen module takes its quantized "
                          "variables as the second argument.")
    out = {k: v for k, v in model.items() if k != "quant"}
    out["params"] = {k: v for k, v in out.get("params", {}).items() if k != "npujax_quant"}
    return out

