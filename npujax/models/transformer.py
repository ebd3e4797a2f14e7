"""Reference transformers in Flax NNX: a ViT encoder and a decoder-only LLM (prefill and decode).

Both are written from the usual pieces so that :func:`npujax.trace_flax` turns them into named
graph ops: ``nnx.LayerNorm``/``nnx.RMSNorm``, ``nnx.Linear``, ``nnx.Embed``, attention as
``einsum``s with a softmax and a mask, GELU or SwiGLU, rotary position embeddings.

* :class:`ViT`: patch embedding (a strided convolution, or the same map as a linear layer on
  flattened patches, the form NPU compilers run a stride-equals-kernel convolution in), a class
  token and learned position
  embeddings, pre-norm encoder blocks (``nnx.MultiHeadAttention``, GELU MLP), a linear head on
  the class token (Dosovitskiy et al. 2021, arXiv:2010.11929).
* :class:`Decoder`: a Llama/Qwen-style decoder (Touvron et al. 2023, arXiv:2302.13971): token
  embedding, pre-norm blocks with RMSNorm, grouped-query attention (``kv_heads`` key/value heads
  shared by ``heads / kv_heads`` query heads; Ainslie et al. 2023, arXiv:2305.13245), rotary
  position embeddings (Su et al. 2021, arXiv:2104.09864), a SwiGLU MLP (Shazeer 2020,
  arXiv:2002.05202), a final RMSNorm and the LM head. ``phase="prefill"`` runs ``seq_len``
  tokens with a causal mask; ``phase="decode"`` runs one new token per sequence against a
  key/value cache of ``kv_len`` earlier positions held in the model (a constant of the traced
  graph: the attention's stationary operand, read once per token).

:class:`DecoderConfig` holds the shapes; :data:`DECODER_CONFIGS` has those of public models, each
with its source.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from npujax.errors import ConfigError
from npujax.models.decoder_config import DecoderConfig

__all__ = ["DecoderConfig", "DECODER_CONFIGS", "Decoder", "ViT", "rotary_tables"]


class _ShippedConfigs(Mapping[str, DecoderConfig]):
    """``{name: DecoderConfig}`` of the ``config.json`` files in ``npujax/models/configs/``
    (read on first use by :func:`npujax.models.hf_config.load_decoder`)."""

    def _names(self) -> list[str]:
        from npujax.models.hf_config import shipped_decoders

        return sorted(shipped_decoders())

    def __getitem__(self, name: str) -> DecoderConfig:
        if name not in self._names():
            raise KeyError(name)
        from npujax.models.hf_config import load_decoder

        return load_decoder(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


#: Public model shapes: each model's ``config.json`` from the Hugging Face Hub, shipped in
#: ``npujax/models/configs/`` (``qwen2.5-0.5b``: Qwen/Qwen2.5-0.5B; ``llama-3.2-1b``:
#: meta-llama/Llama-3.2-1B; ``llama-3.1-8b``: meta-llama/Llama-3.1-8B), and ``tiny``, a
#: test-sized Llama.
DECODER_CONFIGS: Mapping[str, DecoderConfig] = _ShippedConfigs()


def rotary_tables(positions: np.ndarray, head_dim: int, theta: float
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)`` float32 ``[len(positions), head_dim]`` of rotary position embeddings
    (the rotate-half form: frequency ``theta^(-2i/head_dim)`` on dimensions ``i`` and
    ``i + head_dim/2``)."""
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.asarray(positions, np.float64)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], axis=-1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def _rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate ``x [B, S, H, D]`` by the tables ``[S, D]`` (rotate-half form)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[None, :, None, :] + rotated * sin[None, :, None, :]


class _Attention(nnx.Module):
    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs) -> None:
        d, hd = cfg.d_model, cfg.head_dim
        self.cfg = cfg
        self.q = nnx.Linear(d, cfg.heads * hd, use_bias=cfg.qkv_bias, rngs=rngs)
        self.k = nnx.Linear(d, cfg.kv_heads * hd, use_bias=cfg.qkv_bias, rngs=rngs)
        self.v = nnx.Linear(d, cfg.kv_heads * hd, use_bias=cfg.qkv_bias, rngs=rngs)
        self.o = nnx.Linear(cfg.heads * hd, d, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array | None,
                 cache: tuple[jax.Array, jax.Array] | None) -> jax.Array:
        c = self.cfg
        b, s, _ = x.shape
        hd, g = c.head_dim, c.heads // c.kv_heads
        q = _rope(self.q(x).reshape(b, s, c.heads, hd), cos, sin)
        k = _rope(self.k(x).reshape(b, s, c.kv_heads, hd), cos, sin)
        v = self.v(x).reshape(b, s, c.kv_heads, hd)
        if cache is not None:
            k = jnp.concatenate([cache[0], k], axis=1)
            v = jnp.concatenate([cache[1], v], axis=1)
        q = q.reshape(b, s, c.kv_heads, g, hd)  # GQA: g query heads per key/value head
        scores = jnp.einsum("bqkgd,btkd->bkgqt", q, k) * (1.0 / np.sqrt(hd))
        if mask is not None:
            scores = jnp.where(mask, scores, jnp.float32(-1e9))
        probs = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bkgqt,btkd->bqkgd", probs, v)
        return self.o(out.reshape(b, s, c.heads * hd))


class _Block(nnx.Module):
    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs) -> None:
        self.attn_norm = nnx.RMSNorm(cfg.d_model, epsilon=cfg.norm_eps, rngs=rngs)
        self.attn = _Attention(cfg, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(cfg.d_model, epsilon=cfg.norm_eps, rngs=rngs)
        self.gate = nnx.Linear(cfg.d_model, cfg.d_ff, use_bias=False, rngs=rngs)
        self.up = nnx.Linear(cfg.d_model, cfg.d_ff, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(cfg.d_ff, cfg.d_model, use_bias=False, rngs=rngs)

    def __call__(self, x, cos, sin, mask, cache):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask, cache)
        h = self.mlp_norm(x)
        return x + self.down(nnx.silu(self.gate(h)) * self.up(h))


class Decoder(nnx.Module):
    """A decoder-only LLM (see the module docstring) for one phase and static shapes.

    Args:
      cfg: the shapes.
      phase: ``"prefill"`` (``seq_len`` tokens, causal) or ``"decode"`` (one token against a
        cache of ``kv_len`` positions).
      seq_len: prompt length of a prefill (ignored for decode).
      kv_len: cached positions of a decode step (ignored for prefill).
      batch: sequences per step (the decode cache's batch).
      rngs: parameter initialisation.

    Input: int32 token ids ``(batch, seq_len)`` (prefill) or ``(batch, 1)`` (decode).
    Output: float32 logits ``(batch, seq_len or 1, vocab)``.

    Raises:
      ConfigError: an unknown phase, a non-positive length, or a config beyond the reference
        subset (:meth:`DecoderConfig.is_reference`).
    """

    def __init__(self, cfg: DecoderConfig, *, phase: str = "prefill", seq_len: int = 16,
                 kv_len: int = 16, batch: int = 1, rngs: nnx.Rngs) -> None:
        if phase not in ("prefill", "decode"):
            raise ConfigError(f"phase must be 'prefill' or 'decode', got {phase!r}.")
        if not cfg.is_reference():
            raise ConfigError(f"the Flax Decoder implements the Llama/Qwen2 shapes; "
                              f"{cfg.source or 'this config'} uses more (head_size, GeGLU, "
                              "sliding windows, experts, ...): lower it with "
                              "npujax.models.decoders.decoder_graph, built from its shapes.")
        if min(seq_len, kv_len, batch) < 1:
            raise ConfigError(f"seq_len, kv_len and batch must be >= 1, got {seq_len}, "
                              f"{kv_len}, {batch}.")
        self.cfg, self.phase, self.seq_len, self.kv_len = cfg, phase, seq_len, kv_len
        self.embed = nnx.Embed(cfg.vocab, cfg.d_model, rngs=rngs)
        self.blocks = nnx.List([_Block(cfg, rngs=rngs) for _ in range(cfg.layers)])
        self.norm = nnx.RMSNorm(cfg.d_model, epsilon=cfg.norm_eps, rngs=rngs)
        self.head = nnx.Linear(cfg.d_model, cfg.vocab, use_bias=False, rngs=rngs)
        if phase == "decode":
            shape = (cfg.layers, 2, batch, kv_len, cfg.kv_heads, cfg.head_dim)
            self.cache = nnx.Variable(0.5 * jax.random.normal(rngs.params(), shape))

    def __call__(self, tokens: jax.Array) -> jax.Array:
        c = self.cfg
        s = tokens.shape[1]
        start = self.kv_len if self.phase == "decode" else 0
        cos, sin = (jnp.asarray(t) for t in rotary_tables(np.arange(start, start + s),
                                                          c.head_dim, c.rope_theta))
        mask = None
        if self.phase == "prefill":
            mask = jnp.tril(jnp.ones((s, s), bool))[None, None, None]
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            cache = None
            if self.phase == "decode":
                kv = self.cache[...][i]
                cache = (kv[0], kv[1])
            x = block(x, cos, sin, mask, cache)
        return self.head(self.norm(x))


class ViT(nnx.Module):
    """A small Vision Transformer for ``(batch, H, W, C)`` images (see the module docstring).

    Args:
      image: image side (pixels; a multiple of ``patch``).
      channels: input channels.
      patch: patch side (pixels).
      d_model: the encoder's width.
      heads: attention heads.
      d_ff: the MLP's inner size.
      layers: encoder blocks.
      classes: outputs of the head.
      patch_embedding: ``"conv"`` (an ``nnx.Conv`` with stride = kernel = ``patch``) or
        ``"linear"`` (the image cut into flattened ``patch x patch x channels`` patches by a
        reshape and a transpose, then an ``nnx.Linear``: the same function, a Gemm in the graph,
        where the convolution's stride exceeds what many NPU convolution engines accept).
      rngs: parameter initialisation.

    Raises:
      ConfigError: ``image`` not a multiple of ``patch``, or an unknown ``patch_embedding``.
    """

    def __init__(self, *, image: int = 28, channels: int = 1, patch: int = 7, d_model: int = 32,
                 heads: int = 4, d_ff: int = 64, layers: int = 2, classes: int = 10,
                 patch_embedding: str = "conv", rngs: nnx.Rngs) -> None:
        if image % patch:
            raise ConfigError(f"ViT: image side {image} must be a multiple of patch {patch}.")
        if patch_embedding not in ("conv", "linear"):
            raise ConfigError(f"ViT: patch_embedding must be 'conv' or 'linear', got "
                              f"{patch_embedding!r}.")
        n = (image // patch) ** 2
        self.patch_size = patch
        self.patch: nnx.Conv | nnx.Linear
        if patch_embedding == "conv":
            self.patch = nnx.Conv(channels, d_model, (patch, patch), strides=(patch, patch),
                                  padding="VALID", rngs=rngs)
        else:
            self.patch = nnx.Linear(patch * patch * channels, d_model, rngs=rngs)
        self.cls = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, 1, d_model)))
        self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, n + 1, d_model)))
        self.norms1 = nnx.List([nnx.LayerNorm(d_model, rngs=rngs) for _ in range(layers)])
        self.attns = nnx.List([nnx.MultiHeadAttention(num_heads=heads, in_features=d_model,
                                                      decode=False, rngs=rngs)
                               for _ in range(layers)])
        self.norms2 = nnx.List([nnx.LayerNorm(d_model, rngs=rngs) for _ in range(layers)])
        self.fc1 = nnx.List([nnx.Linear(d_model, d_ff, rngs=rngs) for _ in range(layers)])
        self.fc2 = nnx.List([nnx.Linear(d_ff, d_model, rngs=rngs) for _ in range(layers)])
        self.norm = nnx.LayerNorm(d_model, rngs=rngs)
        self.head = nnx.Linear(d_model, classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        if isinstance(self.patch, nnx.Linear):
            b, hh, ww, c = x.shape
            p = self.patch_size
            x = x.reshape(b, hh // p, p, ww // p, p, c).transpose(0, 1, 3, 2, 4, 5)
            x = x.reshape(b, (hh // p) * (ww // p), p * p * c)
        h = self.patch(x)
        b = h.shape[0]
        h = h.reshape(b, -1, h.shape[-1])
        cls = jnp.broadcast_to(self.cls[...], (b, 1, h.shape[-1]))
        h = jnp.concatenate([cls, h], axis=1) + self.pos[...]
        for n1, attn, n2, f1, f2 in zip(self.norms1, self.attns, self.norms2, self.fc1,
                                        self.fc2):
            h = h + attn(n1(h))
            h = h + f2(nnx.gelu(f1(n2(h))))
        return self.head(self.norm(h)[:, 0])
