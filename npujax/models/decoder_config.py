"""The shapes of a decoder-only transformer (:class:`DecoderConfig`): what the latency model needs
of an LLM, read from a ``config.json`` by :mod:`npujax.models.hf_config`."""

from __future__ import annotations

import dataclasses

from npujax.errors import ConfigError

__all__ = ["DecoderConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderConfig:
    """Shapes of a decoder-only transformer (what the latency model needs of an LLM).

    Read from a Hugging Face ``config.json`` by :func:`npujax.models.hf_config.read_config`
    (which documents the fields of each family); the Flax
    :class:`~npujax.models.transformer.Decoder` implements the Llama/Qwen2 subset (no field
    below ``qkv_bias`` set, ``tied_embeddings`` aside).

    Attributes:
      vocab: vocabulary size (tokens).
      d_model: hidden size.
      heads: query heads.
      kv_heads: key/value heads (GQA; ``heads`` must be a multiple).
      d_ff: the dense MLP's inner size.
      layers: decoder blocks.
      rope_theta: rotary embedding base.
      norm_eps: RMSNorm epsilon.
      qkv_bias: biases on the query/key/value projections (Qwen2) or not (Llama).
      head_size: the head dimension when it is not ``d_model / heads`` (Gemma: 256); 0: that
        quotient (``d_model`` must then be a multiple of ``heads``).
      mlp: ``"swiglu"`` (``silu(x W_gate) * x W_up``) or ``"geglu"`` (GELU in place of SiLU,
        Gemma); both three ``d_model x d_ff`` matrices.
      mlp_bias: biases on the MLP's projections.
      tied_embeddings: the LM head is the embedding matrix (fewer parameters; the same bytes
        read per step).
      embed_scale: the embedding is multiplied by ``sqrt(d_model)`` (Gemma).
      sliding_window: keys a local-attention layer attends to (0: none).
      local_layers: the layers with sliding-window attention.
      rotary_dim: dimensions of each head the rotary embedding rotates (0: all; Phi-3's
        ``partial_rotary_factor``).
      qk_norm: an RMSNorm on each query and key head (Qwen3).
      sandwich_norms: RMSNorms after attention and after the MLP too (Gemma 2: four per block).
      attn_softcap, final_softcap: ``cap * tanh(x / cap)`` on the attention scores / the logits
        (Gemma 2).
      experts: routed experts of a mixture-of-experts layer (0: dense model).
      experts_per_token: experts each token is routed to (top-k).
      expert_d_ff: inner size of one routed expert (a SwiGLU/GeGLU MLP).
      shared_d_ff: inner size of the shared expert(s) every token passes through (0: none).
      shared_expert_gate: the shared expert's output scaled by ``sigmoid(x w)`` (Qwen2-MoE).
      moe_layers: the layers whose MLP is the mixture of experts (the others dense, ``d_ff``).
      family: the ``model_type`` it was read as (``""`` when written by hand).
      source: where the shapes come from.

    Raises:
      ConfigError: a non-positive size, heads not divisible as required, an odd rotated
        dimension, or inconsistent expert or layer fields.
    """

    vocab: int
    d_model: int
    heads: int
    kv_heads: int
    d_ff: int
    layers: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    qkv_bias: bool = False
    head_size: int = 0
    mlp: str = "swiglu"
    mlp_bias: bool = False
    tied_embeddings: bool = False
    embed_scale: bool = False
    sliding_window: int = 0
    local_layers: tuple[int, ...] = ()
    rotary_dim: int = 0
    qk_norm: bool = False
    sandwich_norms: bool = False
    attn_softcap: bool = False
    final_softcap: bool = False
    experts: int = 0
    experts_per_token: int = 0
    expert_d_ff: int = 0
    shared_d_ff: int = 0
    shared_expert_gate: bool = False
    moe_layers: tuple[int, ...] = ()
    family: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        for f in ("vocab", "d_model", "heads", "kv_heads", "d_ff", "layers"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"DecoderConfig.{f} must be a positive int, got {v!r}.")
        if (not self.head_size and self.d_model % self.heads) or self.heads % self.kv_heads \
                or self.head_dim % 2 or self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ConfigError(
                f"DecoderConfig: d_model ({self.d_model}) must be a multiple of heads "
                f"({self.heads}) unless head_size is given, heads a multiple of kv_heads "
                f"({self.kv_heads}), and the head size ({self.head_dim}) and rotary_dim "
                f"({self.rotary_dim}) even (rotary embeddings rotate pairs).")
        if self.mlp not in ("swiglu", "geglu"):
            raise ConfigError(f"DecoderConfig.mlp must be 'swiglu' or 'geglu', got {self.mlp!r}.")
        bad = [i for i in (*self.local_layers, *self.moe_layers) if not 0 <= i < self.layers]
        if bad:
            raise ConfigError(f"DecoderConfig: layer indices {bad} outside [0, {self.layers}).")
        if self.experts:
            if not (1 <= self.experts_per_token <= self.experts and self.expert_d_ff >= 1):
                raise ConfigError(
                    f"DecoderConfig: {self.experts} experts need 1 <= experts_per_token "
                    f"({self.experts_per_token}) <= experts and expert_d_ff >= 1 "
                    f"(got {self.expert_d_ff}).")
        elif self.moe_layers or self.experts_per_token or self.shared_d_ff:
            raise ConfigError("DecoderConfig: moe_layers, experts_per_token and shared_d_ff "
                              "need experts >= 1.")

    @property
    def head_dim(self) -> int:
        """``head_size``, or ``d_model / heads``."""
        return self.head_size or self.d_model // self.heads

    def is_reference(self) -> bool:
        """Whether the Flax :class:`~npujax.models.transformer.Decoder` implements these
        shapes (the Llama/Qwen2 subset)."""
        return (not self.head_size or self.head_size == self.d_model // self.heads) and \
            self.mlp == "swiglu" and not any((
                self.mlp_bias, self.embed_scale, self.local_layers,
                self.rotary_dim, self.qk_norm, self.sandwich_norms, self.attn_softcap,
                self.final_softcap, self.experts))

    def parameters(self) -> int:
        """Parameters of the model (norm scales and biases included; tied embeddings once)."""
        d, hd = self.d_model, self.head_dim
        attn = d * hd * (2 * self.heads + 2 * self.kv_heads)
        if self.qkv_bias:
            attn += hd * (self.heads + 2 * self.kv_heads)
        norms = d * (4 if self.sandwich_norms else 2) + (2 * hd if self.qk_norm else 0)
        total = 0
        for i in range(self.layers):
            total += attn + norms + self._mlp_params(i)
        embed = self.vocab * d
        return total + embed * (1 if self.tied_embeddings else 2) + d

    def _mlp_params(self, i: int) -> int:
        d = self.d_model
        dense = lambda f: 3 * d * f + (2 * f + d if self.mlp_bias else 0)  # noqa: E731
        if i not in self.moe_layers:
            return dense(self.d_ff)
        p = self.experts * dense(self.expert_d_ff) + d * self.experts
        if self.shared_d_ff:
            p += dense(self.shared_d_ff) + (d if self.shared_expert_gate else 0)
        return p
