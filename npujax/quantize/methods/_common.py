"""What the PTQ methods share: checked calibration batches, config validation, and a layer's
inputs and outputs on the calibration data (float model, or the partly quantized model)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from npujax._xla_options import cpu_legacy_emitters
from npujax.errors import CalibrationError, ConfigError
from npujax.ir.execute import as_inputs, check_run, execute, execute_nodes, tap
from npujax.ir.graph import Graph, Params

__all__ = ["check_batches", "require", "layer_taps", "copy_params", "waves", "LayerPass"]


def check_batches(batches: Sequence[ArrayLike], method: str) -> list[np.ndarray]:
    """The calibration batches as float32 numpy arrays.

    Raises:
      CalibrationError: no batch, an empty batch, or a batch holding NaN or inf.
    """
    out = []
    for i, x in enumerate(batches):
        a = np.asarray(x, np.float32)
        if a.ndim == 0 or a.shape[0] == 0:
            raise CalibrationError(f"{method}: calibration batch {i} is empty (shape "
                                   f"{a.shape}); pass non-empty (batch, ...) arrays.")
        if not np.all(np.isfinite(a)):
            raise CalibrationError(f"{method}: calibration batch {i} holds NaN or inf; clean "
                                   "the data before quantizing.")
        out.append(a)
    if not out:
        raise CalibrationError(f"{method} needs at least one calibration batch; got none.")
    return out


def require(ok: bool, cls: str, field: str, value: Any, rule: str) -> None:
    """Raise ``ConfigError("<cls>.<field> must be <rule>, got <value>.")`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{cls}.{field} must be {rule}, got {value!r}.")


def is_number(v: Any) -> bool:
    """A real Python/numpy number that is not a bool."""
    return isinstance(v, int | float | np.floating | np.integer) and not isinstance(v, bool) \
        and bool(np.isfinite(v))


def is_int(v: Any) -> bool:
    """A Python/numpy integer that is not a bool."""
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def layer_taps(graph: Graph, params: Params, batches: Sequence[np.ndarray], names: Sequence[str],
               quant: Mapping[str, Any] | None = None, qstate: Mapping[str, Any] | None = None
               ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{layer: (input, output)}`` of each layer in ``names`` over all batches (concatenated
    along the batch axis, float32 numpy): the input as the layer reads it (after its own input
    fake-quant where ``quant`` quantizes it), the output after its fused activation.

    Runs the model with ``quant``/``qstate`` (None: the float model), one compiled program.
    """
    names = list(names)
    fn = jax.jit(lambda p, x: execute(graph, p, x, quant=quant, qstate=qstate,
                                      observe=tap(names))[1])
    ins: dict[str, list[np.ndarray]] = {n: [] for n in names}
    outs: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for x in batches:
        rec = jax.device_get(fn(params, jnp.asarray(x)))
        for n in names:
            ins[n].append(np.asarray(rec[n][0], np.float32))
            outs[n].append(np.asarray(rec[n][1], np.float32))
    return {n: (np.concatenate(ins[n]), np.concatenate(outs[n])) for n in names}


def copy_params(params: Params) -> Params:
    """A copy of the params tree (new dicts; arrays shared)."""
    return {k: dict(v) for k, v in params.items()}


def waves(graph: Graph, names: Sequence[str]) -> list[list[str]]:
    """``names`` grouped for a sequential layer-by-layer method: wave ``k`` holds the layers
    whose inputs depend on layers of ``names`` in waves ``< k`` only (Q, K and V projections,
    which read one tensor, share a wave), in graph order. One run of the model then gives the
    inputs of a whole wave, with every earlier wave quantized."""
    wanted = set(names)
    producer = {t: n for n in graph.nodes for t in n.outputs}
    level: dict[str, int] = {}  # node -> 1 + the wave of the latest wanted layer upstream
    for n in graph.nodes:
        up = 0
        for t in n.inputs:
            p = producer.get(t)
            if p is not None:
                up = max(up, level[p.name] + (1 if p.name in wanted else 0))
        level[n.name] = up
    out: dict[int, list[str]] = {}
    for n in graph.nodes:
        if n.name in wanted:
            out.setdefault(level[n.name], []).append(n.name)
    return [out[k] for k in sorted(out)]


class LayerPass:
    """The model run once over the calibration batches, layer by layer, for a method that
    changes each layer (its kernel, its quantizer) before the next one reads its output.

    :meth:`layer_input` runs the graph's nodes from where the previous call stopped through
    ``name`` (the previous layer run again first, with its new params and quantizer), over
    every batch, and returns ``name``'s input as the layer reads it. Each batch's live
    activations are held between calls (a tensor is dropped after its last reader), so the
    whole pass costs about one run of the model plus each layer once more, where running the
    model once per wave of layers (:func:`waves` with :func:`layer_taps`) costs one run per
    wave. A layer's input is what that per-wave run gives (layers upstream of it changed,
    the others not read), up to float rounding: each piece is its own program (XLA fuses
    other operations, and the pieces compile with XLA:CPU's legacy emitters,
    :mod:`npujax._xla_options`). The sequential bias correction
    (:func:`npujax.quantize.ptq.bias_correction`, ``mode="model"``) runs on it too.

    Args:
      graph: the model.
      batches: the calibration batches, float32 ``(batch, ...)``.

    Raises:
      LimitError: a batch whose activations would exceed ``max_tensor_bytes``
        (:func:`npujax.ir.execute.check_run`).
    """

    def __init__(self, graph: Graph, batches: Sequence[ArrayLike]):
        self.graph = graph
        self.last_read: dict[str, int] = {}
        for i, node in enumerate(graph.nodes):
            self.last_read.update((t, i) for t in node.inputs)
        self.index = {node.name: i for i, node in enumerate(graph.nodes)}
        self.envs: list[tuple[int, dict[str, jax.Array]]] = []
        for x in batches:
            xs = as_inputs(graph, jnp.asarray(x, jnp.float32))
            check_run(graph, int(xs[0].shape[0]))
            self.envs.append((int(xs[0].shape[0]), {t: v for t, v in zip(graph.inputs, xs)
                                                    if t in self.last_read}))
        self.start = 0

    def layer_input(self, name: str, params: Params, quant: Mapping[str, Any],
                    qstate: Mapping[str, Any] | None) -> np.ndarray:
        """``name``'s input over every batch (concatenated, float32 numpy) in the model with
        ``params``, ``quant`` and ``qstate`` as they are now (``quant[name]``, if given,
        fake-quantizes the input as the layer reads it).

        Raises:
          ValueError: ``name`` comes before the layer of the previous call (graph order).
        """
        return self._advance(name, params, quant, qstate, output=False)[0]

    def layer_io(self, name: str, params: Params, quant: Mapping[str, Any],
                 qstate: Mapping[str, Any] | None) -> tuple[np.ndarray, np.ndarray]:
        """``(input, output)`` of ``name`` over every batch (each concatenated, float32
        numpy), as :meth:`layer_input` gives the input; the output is the layer's after its
        fused activation, with ``params[name]``. With ``params`` the float model's and
        ``quant`` empty, the pass gives each layer's float input and float output in turn
        (what :func:`layer_taps` gives for all layers at once), holding one layer's.

        Raises:
          ValueError: ``name`` comes before the layer of the previous call (graph order).
        """
        x, y = self._advance(name, params, quant, qstate, output=True)
        assert y is not None
        return x, y

    def layer_reduce(self, name: str, params: Params, quant: Mapping[str, Any],
                     qstate: Mapping[str, Any] | None,
                     reduce: Callable[[jax.Array, Params], jax.Array]) -> list[np.ndarray]:
        """``reduce(input, params)`` of ``name``'s input (as :meth:`layer_input` gives it, with
        ``params`` restricted to the nodes this piece runs), computed inside each batch's
        compiled piece, one result per batch: a statistic of the layer (e.g. its output's
        per-channel mean) without holding its input over every batch.

        Raises:
          ValueError: ``name`` comes before the layer of the previous call (graph order).
        """
        return self._run(name, params, quant, qstate, lambda taps, p: reduce(taps[0], p))

    def _advance(self, name: str, params: Params, quant: Mapping[str, Any],
                 qstate: Mapping[str, Any] | None, *, output: bool
                 ) -> tuple[np.ndarray, np.ndarray | None]:
        """Run the nodes from the previous call's layer through ``name``: ``name``'s input and
        (``output``) its output over every batch."""
        got = self._run(name, params, quant, qstate,
                        lambda taps, p: taps[:2] if output else taps[:1])
        xs = [np.asarray(g[0], np.float32) for g in got]
        ys = [np.asarray(g[1], np.float32) for g in got] if output else None
        return np.concatenate(xs), (np.concatenate(ys) if ys is not None else None)

    def _run(self, name: str, params: Params, quant: Mapping[str, Any],
             qstate: Mapping[str, Any] | None, select: Callable[[Any, Params], Any]
             ) -> list[Any]:
        """Run the nodes from the previous call's layer through ``name`` over every batch, each
        batch's piece returning ``select(name's taps, params)``; one result per batch."""
        graph, stop = self.graph, self.index[name]
        if stop < self.start:
            raise ValueError(f"LayerPass: {name} comes before {graph.nodes[self.start].name}; "
                             "ask for the layers in graph order.")
        order = tuple(range(self.start, stop + 1))
        written = {t for i in order[:-1] for t in graph.nodes[i].outputs}
        # what a later piece reads: this layer's own inputs too, as it runs again there
        keep = tuple(sorted(t for t in written if self.last_read.get(t, -1) >= stop))
        reads = sorted({t for i in order for t in graph.nodes[i].inputs
                        if t not in written and t not in graph.constants})
        run = [graph.nodes[i].name for i in order]
        p = {n: params[n] for n in run if n in params}
        q = {n: quant[n] for n in run if n in quant}
        qs = {n: qstate[n] for n in run if qstate is not None and n in qstate and n in q}

        def piece(p, qs, env, *, batch):
            kept, taps = execute_nodes(graph, p, env, order, batch=batch, keep=keep, quant=q,
                                       qstate=qs, observe=tap([name]))
            return kept, select(taps[name], p)

        fn = jax.jit(piece, static_argnames="batch", compiler_options=cpu_legacy_emitters())
        got = []
        for batch, env in self.envs:
            kept, out = fn(p, qs, {t: env[t] for t in reads}, batch=batch)
            for t in [t for t in env if self.last_read[t] < stop]:
                del env[t]
            env.update(kept)
            got.append(out)
        self.start = stop
        return got
