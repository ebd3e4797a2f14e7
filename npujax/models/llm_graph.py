"""An LLM decoder step's graph built from its shapes alone (:func:`build_decoder_graph`).

The latency model needs each layer's operator and shapes, never a weight: this module writes the
graph of one step of a :class:`~npujax.models.transformer.DecoderConfig` directly, node by node,
with every weight and table an :class:`~npujax.ir.absent.AbsentArray`. No Flax model is built or
traced and nothing of the model's size is allocated (an 8 B-parameter config costs a few MB).

For the configs the Flax reference :class:`~npujax.models.transformer.Decoder` implements, the
graph is the one :func:`npujax.trace_flax` makes of it, node for node (names, operators, shapes,
order; ``tests/models/test_llm_graph.py`` checks the lowered costs are equal), so the two paths
cannot disagree. Beyond it (:mod:`npujax.models.hf_config`):

* ``head_size`` != ``d_model / heads``, GeGLU (``Gelu`` in place of ``Sigmoid`` x), the Gemma
  embedding scale (a ``Mul``), Qwen3's per-head query/key RMSNorm, Gemma 2's four norms and
  soft-capping (``Div``, ``Tanh``, ``Mul``), partial rotary embeddings (the rotation on the first
  ``rotary_dim`` dimensions, a ``Slice`` and a ``Concat`` around it);
* **sliding-window attention**: a decode step of a local layer reads ``min(kv_len, window - 1)``
  cached positions (keys within ``window`` of the query, the Transformers library's mask); a
  prefill computes the full causal score matrix and masks it (as a kernel without block
  skipping does: an upper bound);
* **mixture of experts** (:func:`npujax.models.moe.expert_loads` gives the routing): a router
  ``Gemm`` (``d_model x experts``) and ``Softmax``; per load class of ``g`` experts with ``m``
  tokens each, a ``Gather`` dispatching the tokens and three batched ``MatMul`` s whose second
  operand ``[g, d_model, expert_d_ff]`` is the experts' weights (read once per step, at the
  weight width); the ``k`` expert outputs combined by a ``Mul`` and a ``ReduceSum``; a shared
  expert as a dense MLP (with Qwen2-MoE's sigmoid gate);
* **per-sequence cache lengths**: the linear layers run the whole batch; attention runs once
  per group of sequences with the same length (``Slice`` on the batch, ``Concat`` after);
* **chunks**: a step of ``tokens`` new tokens per sequence against ``kv_len`` cached ones
  (prefill: ``kv_len = 0``; decode: one token; a chunk of a chunked prefill: both), causally
  masked when ``tokens > 1``;
* a prefill's LM head computes the last position's logits only (what generation needs; the
  Transformers library's ``logits_to_keep=1``, vLLM), a decode step's every sequence's.

The attention MatMuls read the cache as the traced graph does by default (``kv_cache="copy"``):
the cache ``Concat`` with the new positions and transposed, a copy of the whole cache per step
(see ``docs/npu_model.md``). ``kv_cache="in_place"`` is what serving runtimes do (vLLM's paged
cache, llama.cpp's, TensorRT-LLM's): the step writes only its new keys and values into the cache
(graph outputs besides the result) and each attention MatMul reads the cache where it lies, in
the layout it multiplies (graph inputs ``.../kv_cache/k_i`` ``[b, kv_heads, positions,
head_dim]`` and ``.../kv_cache/v_i`` ``[b, kv_heads, head_dim, positions]``, the step's state):
no copy, one read of every cached element.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from npujax.errors import ConfigError
from npujax.ir.absent import AbsentArray
from npujax.ir.graph import Graph, Node, Params, TensorType

__all__ = ["build_decoder_graph", "KV_CACHES", "KV_CACHE"]

#: How a step reads its key/value cache (:func:`build_decoder_graph`).
KV_CACHES = ("copy", "in_place")

#: The scope of an in-place cache's graph inputs (``blocks/0/attn/kv_cache/k_0``), by which
#: :func:`npujax.models.decoders.kv_cache_operands` finds them.
KV_CACHE = "kv_cache"


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.tensors: dict[str, TensorType] = {}
        self.constants: dict[str, Any] = {}
        self.params: Params = {}
        self._n = 0
        self._names: dict[str, int] = {}
        self.outputs: list[str] = []  # tensors written besides the step's result (a cache's)
        self.inputs: list[str] = []  # tensors read besides the tokens (an in-place cache)

    def t(self, shape: Sequence[int], dtype: str = "float32") -> str:
        name = f"t{self._n}"
        self._n += 1
        self.tensors[name] = TensorType(tuple(int(d) for d in shape), dtype)
        return name

    def const(self, shape: Sequence[int], dtype: str = "float32") -> str:
        name = f"const_{len(self.constants)}"
        self.constants[name] = AbsentArray(shape, dtype, f"decoder constant {name}")
        self.tensors[name] = TensorType(tuple(int(d) for d in shape), dtype)
        return name

    def cache(self, scope: str, which: str, shape: Sequence[int]) -> str:
        """A key or value cache read in place: a graph input of ``shape`` (the layout its
        attention MatMul reads; the cache is the step's state, read from memory) named
        ``<scope>{KV_CACHE}/<which>_<i>``, by which
        :func:`npujax.models.decoders.kv_cache_operands` knows it."""
        name = self.name(f"{scope}{KV_CACHE}/", which)
        self.tensors[name] = TensorType(tuple(int(d) for d in shape), "float32")
        self.inputs.append(name)
        return name

    def name(self, scope: str, base: str) -> str:
        key = f"{scope}{base}"
        i = self._names.get(key, 0)
        self._names[key] = i + 1
        return f"{scope}{base}_{i}"

    def op(self, name: str, op: str, inputs: Sequence[str], shape: Sequence[int],
           attrs: dict[str, Any] | None = None,
           params: Mapping[str, tuple[int, ...]] | None = None,
           dtype: str = "float32") -> str:
        out = self.t(shape, dtype)
        self.nodes.append(Node(name, op, tuple(inputs), (out,), attrs or {},
                               tuple(params or {})))
        if params:
            self.params[name] = {r: AbsentArray(s, np.float32, f"{name}/{r}")
                                 for r, s in params.items()}
        return out

    def shape(self, t: str) -> tuple[int, ...]:
        return self.tensors[t].shape

    # -- layers
    def linear(self, name: str, x: str, n: int, bias: bool = False) -> str:
        k = self.shape(x)[-1]
        p = {"kernel": (k, n)} | ({"bias": (n,)} if bias else {})
        return self.op(name, "Gemm", [x], (*self.shape(x)[:-1], n), params=p)

    def rmsnorm(self, name: str, x: str, eps: float) -> str:
        return self.op(name, "RMSNormalization", [x], self.shape(x),
                       {"epsilon": eps, "axis": -1}, {"scale": (self.shape(x)[-1],)})

    def unary(self, scope: str, op: str, x: str, attrs: dict[str, Any] | None = None) -> str:
        return self.op(self.name(scope, op.lower()), op, [x], self.shape(x), attrs)

    def binary(self, scope: str, op: str, a: str, b: str) -> str:
        shape = np.broadcast_shapes(self.shape(a), self.shape(b))
        return self.op(self.name(scope, op.lower()), op, [a, b], shape)

    def reshape(self, scope: str, x: str, shape: Sequence[int]) -> str:
        return self.op(self.name(scope, "reshape"), "Reshape", [x], shape,
                       {"shape": [0, *shape[1:]]})

    def transpose(self, name: str, x: str, perm: Sequence[int]) -> str:
        s = self.shape(x)
        return self.op(name, "Transpose", [x], [s[p] for p in perm], {"perm": list(perm)})

    def slice(self, scope: str, x: str, axis: int, start: int, end: int) -> str:
        s = list(self.shape(x))
        s[axis] = end - start
        return self.op(self.name(scope, "slice"), "Slice", [x], s,
                       {"axes": [axis], "starts": [start], "ends": [end], "steps": [1]})

    def concat(self, scope: str, xs: Sequence[str], axis: int) -> str:
        s = list(self.shape(xs[0]))
        s[axis] = sum(self.shape(x)[axis] for x in xs)
        return self.op(self.name(scope, "concat"), "Concat", list(xs), s, {"axis": axis})

    def matmul(self, scope: str, a: str, b: str) -> str:
        sa, sb = self.shape(a), self.shape(b)
        return self.op(self.name(scope, "matmul"), "MatMul", [a, b],
                       (*np.broadcast_shapes(sa[:-2], sb[:-2]), sa[-2], sb[-1]))

    def rope(self, scope: str, x: str, rotary_dim: int) -> str:
        """The rotate-half rotary embedding of ``x [B, S, H, D]`` (as the reference traces)."""
        b, s, h, d = self.shape(x)
        r = rotary_dim or d
        xr = x if r == d else self.slice(scope, x, 3, 0, r)
        hi = self.slice(scope, xr, 3, r // 2, r)
        neg = self.unary(scope, "Neg", hi)
        lo = self.slice(scope, xr, 3, 0, r // 2)
        rot = self.concat(scope, [neg, lo], 3)
        a = self.binary(scope, "Mul", xr, self.const((1, s, 1, r)))
        c = self.binary(scope, "Mul", rot, self.const((1, s, 1, r)))
        out = self.binary(scope, "Add", a, c)
        if r != d:
            out = self.concat(scope, [out, self.slice(scope, x, 3, r, d)], 3)
        return out


def _attention(bd: _Builder, cfg: Any, scope: str, q: str, k: str, v: str, cached: int,
               local: bool, kv_cache: str = "copy") -> str:
    """Grouped-query attention of ``q [b, s, H, D]`` against ``k, v [b, s, KV, D]`` and
    ``cached`` positions of cache (``kv_cache``: see :func:`build_decoder_graph`); returns
    ``[b, s, H * D]``."""
    b, s, _, hd = bd.shape(q)
    kvh, g = cfg.kv_heads, cfg.heads // cfg.kv_heads
    if local and cfg.sliding_window:
        cached = min(cached, cfg.sliding_window - 1)
    t = cached + s
    in_place = kv_cache == "in_place"
    if in_place:
        bd.outputs += [k, v]  # the new positions, written into the cache
    if cached and not in_place:
        k = bd.concat(scope, [bd.const((b, cached, kvh, hd)), k], 1)
        v = bd.concat(scope, [bd.const((b, cached, kvh, hd)), v], 1)
    q5 = bd.reshape(scope, q, (b, s, kvh, g, hd))
    qt = bd.transpose(bd.name(scope, "matmul_b_transpose"), q5, (0, 2, 4, 1, 3))
    qt = bd.op(bd.name(scope, "matmul_b_reshape"), "Reshape", [qt], (b, kvh, hd, s * g),
               {"shape": [0, kvh, hd, s * g]})
    if cached and in_place:  # every position, the new ones included, in the MatMul's layout
        kt = bd.cache(scope, "k", (b, kvh, t, hd))
    else:
        kt = bd.transpose(bd.name(scope, "matmul_a_transpose"), k, (0, 2, 1, 3))
    sc = bd.matmul(scope, kt, qt)
    sc = bd.reshape(scope, sc, (b, kvh, t, s, g))
    sc = bd.transpose(bd.name(scope, "transpose"), sc, (0, 1, 4, 3, 2))
    sc = bd.binary(scope, "Mul", sc, bd.const(()))
    if cfg.attn_softcap:
        sc = bd.binary(scope, "Div", sc, bd.const(()))
        sc = bd.unary(scope, "Tanh", sc)
        sc = bd.binary(scope, "Mul", sc, bd.const(()))
    if s > 1:
        shape = bd.shape(sc)
        sc = bd.op(bd.name(scope, "where"), "Where",
                   [bd.const(shape, "bool"), sc, bd.const(shape)], shape)
    p = bd.unary(scope, "Softmax", sc, {"axis": 4})
    pt = bd.transpose(bd.name(scope, "matmul_b_transpose"), p, (0, 1, 4, 2, 3))
    pt = bd.op(bd.name(scope, "matmul_b_reshape"), "Reshape", [pt], (b, kvh, t, g * s),
               {"shape": [0, kvh, t, g * s]})
    if cached and in_place:
        vt = bd.cache(scope, "v", (b, kvh, hd, t))
    else:
        vt = bd.transpose(bd.name(scope, "matmul_a_transpose"), v, (0, 2, 3, 1))
    o = bd.matmul(scope, vt, pt)
    o = bd.reshape(scope, o, (b, kvh, hd, g, s))
    o = bd.transpose(bd.name(scope, "transpose"), o, (0, 4, 1, 3, 2))
    return bd.reshape(scope, o, (b, s, cfg.heads * hd))


def _mlp(bd: _Builder, cfg: Any, scope: str, h: str, d_ff: int, prefix: str = "") -> str:
    gate = bd.linear(f"{scope}{prefix}gate", h, d_ff, cfg.mlp_bias)
    if cfg.mlp == "swiglu":
        act = bd.binary(scope, "Mul", gate, bd.unary(scope, "Sigmoid", gate))
    else:
        act = bd.unary(scope, "Gelu", gate, {"approximate": "tanh"})
    up = bd.linear(f"{scope}{prefix}up", h, d_ff, cfg.mlp_bias)
    return bd.linear(f"{scope}{prefix}down", bd.binary(scope, "Mul", act, up), cfg.d_model,
                     cfg.mlp_bias)


def _moe(bd: _Builder, cfg: Any, scope: str, h: str, loads: Sequence[tuple[int, int]]) -> str:
    """The mixture-of-experts MLP of ``h [b, s, d]``: router, experts by load class
    ``(experts, tokens each)``, combine, shared expert."""
    b, s, d = bd.shape(h)
    n, k = b * s, cfg.experts_per_token
    logits = bd.linear(f"{scope}moe/router", h, cfg.experts)
    bd.unary(f"{scope}moe/", "Softmax", logits, {"axis": 2})
    flat = bd.reshape(f"{scope}moe/", h, (n, d))
    outs = []
    for c, (g, m) in enumerate(loads):
        sc = f"{scope}moe/experts_{c}/"
        x = bd.op(f"{sc}dispatch", "Gather", [flat, bd.const((g, m), "int32")], (g, m, d),
                  {"axis": 0})
        gate = bd.matmul(sc, x, bd.const((g, d, cfg.expert_d_ff)))
        if cfg.mlp == "swiglu":
            act = bd.binary(sc, "Mul", gate, bd.unary(sc, "Sigmoid", gate))
        else:
            act = bd.unary(sc, "Gelu", gate, {"approximate": "tanh"})
        up = bd.matmul(sc, x, bd.const((g, d, cfg.expert_d_ff)))
        y = bd.matmul(sc, bd.binary(sc, "Mul", act, up), bd.const((g, cfg.expert_d_ff, d)))
        outs.append(bd.reshape(sc, y, (g * m, d)))
    y = outs[0] if len(outs) == 1 else bd.concat(f"{scope}moe/", outs, 0)
    y = bd.reshape(f"{scope}moe/", y, (n, k, d))
    y = bd.binary(f"{scope}moe/", "Mul", y, bd.const((n, k, 1)))
    y = bd.op(f"{scope}moe/combine", "ReduceSum", [y], (n, d), {"axes": [1], "keepdims": 0})
    y = bd.reshape(f"{scope}moe/", y, (b, s, d))
    if cfg.shared_d_ff:
        sh = _mlp(bd, cfg, scope, h, cfg.shared_d_ff, "moe/shared/")
        if cfg.shared_expert_gate:
            gate = bd.unary(f"{scope}moe/", "Sigmoid",
                            bd.linear(f"{scope}moe/shared/gate_proj", h, 1))
            sh = bd.binary(f"{scope}moe/", "Mul", sh, gate)
        y = bd.binary(f"{scope}moe/", "Add", y, sh)
    return y


def build_decoder_graph(cfg: Any, *, tokens: int, kv_lens: Sequence[int],
                        expert_loads: Sequence[tuple[int, int]] = (),
                        logits: str = "auto", kv_cache: str = "copy") -> tuple[Graph, Params]:
    """The graph of one step of ``cfg`` (see the module docstring), unoptimized.

    Args:
      cfg: a :class:`~npujax.models.transformer.DecoderConfig`.
      tokens: new tokens per sequence (a prefill's prompt, 1 for a decode step, a chunk).
      kv_lens: cached positions of each sequence (its length is the batch); 0 for a prefill.
      expert_loads: for a mixture of experts, ``(experts, tokens each)`` per load class
        (:func:`npujax.models.moe.expert_loads`), the same in every MoE layer.
      logits: ``"last"`` (the last position's, what generation needs), ``"all"``, ``"none"``
        (a chunk of a chunked prefill before the last: no norm and no LM head, the last block's
        output is the graph's) or ``"auto"`` (``"last"`` for a step of several tokens,
        ``"all"`` for one).
      kv_cache: ``"copy"`` (the traced graph's: the cache concatenated with the new positions
        and transposed every step) or ``"in_place"`` (the new positions written into the
        cache, which the attention MatMuls read in their own layout; the module docstring).

    Returns:
      ``(graph, params)``: int32 ``tokens [batch, tokens]`` in (and an in-place cache's
      inputs, the module docstring), float32 logits ``[batch, 1 or
      tokens, vocab]`` (or the hidden state, ``logits="none"``) out as ``output``, and with
      an in-place cache each layer's new keys and values ``[b, tokens, kv_heads, head_dim]``
      as the further outputs; the params and constants are absent arrays.

    Raises:
      ConfigError: no sequence, a non-positive token count or a negative cache length, an
        unknown ``kv_cache``, or expert loads missing for a mixture of experts or not summing
        to ``tokens x batch x experts_per_token``.
    """
    kv_lens = [int(x) for x in kv_lens]
    if not kv_lens or tokens < 1 or min(kv_lens) < 0:
        raise ConfigError(f"a decoder step needs >= 1 sequence, >= 1 token and cache lengths "
                          f">= 0; got {len(kv_lens)} sequences, {tokens} tokens, "
                          f"{kv_lens[:4]}.")
    if kv_cache not in KV_CACHES:
        raise ConfigError(f"kv_cache must be one of {', '.join(KV_CACHES)}, got {kv_cache!r}.")
    b, s, d, hd = len(kv_lens), tokens, cfg.d_model, cfg.head_dim
    if cfg.moe_layers and sum(g * m for g, m in expert_loads) != b * s * cfg.experts_per_token:
        raise ConfigError(f"expert loads {list(expert_loads)} must route {b} x {s} tokens x "
                          f"top-{cfg.experts_per_token} = {b * s * cfg.experts_per_token} "
                          "assignments.")
    bd = _Builder()
    tok = "tokens"
    bd.tensors[tok] = TensorType((b, s), "int32")
    x = bd.op("embed", "Gather", [tok], (b, s, d), {"axis": 0}, {"table": (cfg.vocab, d)})
    if cfg.embed_scale:
        x = bd.binary("", "Mul", x, bd.const(()))
    groups: dict[int, list[int]] = {}
    for i, L in enumerate(kv_lens):
        groups.setdefault(L, []).append(i)
    for i in range(cfg.layers):
        sc = f"blocks/{i}/"
        a = f"{sc}attn/"
        h = bd.rmsnorm(f"{sc}attn_norm", x, cfg.norm_eps)
        qkv = []
        for what, heads in (("q", cfg.heads), ("k", cfg.kv_heads), ("v", cfg.kv_heads)):
            y = bd.reshape(a, bd.linear(f"{a}{what}", h, heads * hd, cfg.qkv_bias),
                           (b, s, heads, hd))
            if cfg.qk_norm and what != "v":
                y = bd.rmsnorm(f"{a}{what}_norm", y, cfg.norm_eps)
            qkv.append(bd.rope(a, y, cfg.rotary_dim) if what != "v" else y)
        local = i in cfg.local_layers
        if len(groups) == 1:
            o = _attention(bd, cfg, a, qkv[0], qkv[1], qkv[2], kv_lens[0], local, kv_cache)
        else:  # sequences of different cache lengths: attention per length
            parts = []
            for L, rows in sorted(groups.items()):
                lo, hi = rows[0], rows[-1] + 1
                if rows != list(range(lo, hi)):
                    raise ConfigError("sequences of one cache length must be adjacent "
                                      "(sort kv_lens).")
                q, k, v = (bd.slice(a, t, 0, lo, hi) for t in qkv)
                parts.append(_attention(bd, cfg, a, q, k, v, L, local, kv_cache))
            o = bd.concat(a, parts, 0)
        o = bd.linear(f"{a}o", o, d)
        if cfg.sandwich_norms:
            o = bd.rmsnorm(f"{sc}post_attn_norm", o, cfg.norm_eps)
        x = bd.binary(sc, "Add", x, o)
        h = bd.rmsnorm(f"{sc}mlp_norm", x, cfg.norm_eps)
        m = (_moe(bd, cfg, sc, h, expert_loads) if i in cfg.moe_layers
             else _mlp(bd, cfg, sc, h, cfg.d_ff))
        if cfg.sandwich_norms:
            m = bd.rmsnorm(f"{sc}post_mlp_norm", m, cfg.norm_eps)
        x = bd.binary(sc, "Add", x, m)
    if logits not in ("auto", "last", "all", "none"):
        raise ConfigError(f"logits must be 'auto', 'last', 'all' or 'none', got {logits!r}.")
    if logits == "none":
        return _finish(bd, x, cfg)
    x = bd.rmsnorm("norm", x, cfg.norm_eps)
    if s > 1 and logits in ("auto", "last"):  # the last position's logits
        x = bd.slice("", x, 1, s - 1, s)
    y = bd.linear("head", x, cfg.vocab)
    if cfg.final_softcap:
        y = bd.binary("", "Div", y, bd.const(()))
        y = bd.unary("", "Tanh", y)
        y = bd.binary("", "Mul", y, bd.const(()))
    return _finish(bd, y, cfg)


def _finish(bd: _Builder, y: str, cfg: Any) -> tuple[Graph, Params]:
    """The graph with ``y`` (the last node's output) renamed ``output``."""
    tok = "tokens"
    bd.tensors["output"] = bd.tensors[y]
    last = bd.nodes[-1]
    bd.nodes[-1] = last.replace(outputs=("output",))
    del bd.tensors[y]
    # an in-place cache's new keys and values, in their producers' order
    present = tuple(dict.fromkeys(bd.outputs))
    graph = Graph(tuple(bd.nodes), (tok, *bd.inputs), ("output", *present), bd.tensors,
                  bd.constants, source=f"decoder shapes ({cfg.source or 'DecoderConfig'})")
    return graph, bd.params


