"""Decoder shapes from a Hugging Face ``config.json``: :func:`read_config` and :func:`load_decoder`.

Every field of the file is accounted for. A field that sets a shape or a cost is read
(:data:`COST_FIELDS`); a field that changes no shape and no cost (token ids, dropout, the rotary
base, initialisation) is ignored because it is on :data:`NON_COST_FIELDS`; a field the reader
knows but models only approximately is read with a warning that says how
(:data:`APPROXIMATED_FIELDS`); a field that changes the architecture in a way npujax does not
model (multi-head latent attention, a vision tower) is refused naming it
(:data:`UNSUPPORTED_FIELDS`), and so is any other field: an unknown field may change shapes, so it
is never guessed at (pass ``ignore=("name",)`` / ``--ignore-config-field NAME`` when you know it
does not).

Families and what each field maps to (``model_type``; fields as the Transformers library's
``configuration_*.py`` define them):

========================  =====================================================================
Llama 2/3, Mistral,       ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
Qwen2/2.5, Qwen3, Phi-3   ``num_attention_heads``, ``num_key_value_heads`` (GQA; default: MHA),
                          ``head_dim`` (default ``hidden / heads``), ``vocab_size``,
                          ``tie_word_embeddings`` (one matrix for the embedding and the LM head:
                          fewer parameters, the same MACs and bytes per step),
                          ``attention_bias``/``mlp_bias`` (Qwen2: q/k/v biases always),
                          ``hidden_act`` (``silu``: SwiGLU; ``gelu*``: GeGLU),
                          ``sliding_window`` with ``use_sliding_window``/``max_window_layers``
                          (Qwen2) or on every layer (Mistral), ``partial_rotary_factor``
                          (Phi-3: rotary embedding on that fraction of each head). Qwen3 adds an
                          RMSNorm on each query and key head. Phi-3's fused ``qkv_proj`` and
                          ``gate_up_proj`` hold the same weights as separate projections: same
                          MACs and bytes.
Gemma, Gemma 2            ``hidden_activation`` (GeGLU, ``gelu_pytorch_tanh``), ``head_dim``
                          (256 with 8 x 256 != 3072 on Gemma 7B), tied embeddings, the embedding
                          scaled by ``sqrt(hidden)``; Gemma 2: four RMSNorms per block,
                          ``sliding_window`` on every other layer (even layers local; or
                          ``layer_types``), ``attn_logit_softcapping`` and
                          ``final_logit_softcapping`` (``cap * tanh(x / cap)``: vector work).
                          ``query_pre_attn_scalar`` only changes the scale's value.
Mixtral                   ``num_local_experts``, ``num_experts_per_tok``; every layer's MLP is a
                          mixture of experts of ``intermediate_size``.
Qwen2-MoE, Qwen3-MoE      ``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
                          ``shared_expert_intermediate_size`` (a shared expert and its sigmoid
                          gate, Qwen2-MoE), ``decoder_sparse_step`` (layer ``i`` is sparse when
                          ``(i + 1) % step == 0``), ``mlp_only_layers`` (dense layers of
                          ``intermediate_size``).
DeepSeek-MoE              ``n_routed_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
                          ``n_shared_experts`` (one shared expert of ``n_shared_experts x
                          moe_intermediate_size``), ``first_k_dense_replace`` and
                          ``moe_layer_freq`` (layer ``i`` is sparse when ``i >= k`` and
                          ``i % freq == 0``). Group-limited routing (``n_group``,
                          ``topk_group``) is costed as uniform top-k routing, with a warning.
========================  =====================================================================

References: the Transformers library's ``LlamaConfig``, ``MistralConfig``, ``Qwen2Config``,
``Qwen3Config``, ``Gemma2Config``, ``Phi3Config``, ``MixtralConfig``, ``Qwen2MoeConfig``; the
DeepSeek-MoE release's ``configuration_deepseek.py`` (Dai et al. 2024, arXiv:2401.06066); Gemma 2
(Gemma Team 2024, arXiv:2408.00118); Mistral 7B (Jiang et al. 2023, arXiv:2310.06825).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Collection, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from npujax.errors import ConfigError
from npujax.models.decoder_config import DecoderConfig

__all__ = ["read_config", "load_decoder", "shipped_decoders", "COST_FIELDS", "NON_COST_FIELDS",
           "APPROXIMATED_FIELDS", "UNSUPPORTED_FIELDS", "MODEL_TYPES"]

log = logging.getLogger(__name__)

#: The ``model_type`` values read (others are refused: their architecture is unknown).
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "mixtral",
               "qwen2_moe", "qwen3_moe", "deepseek")

#: Fields that set a shape or a cost (read).
COST_FIELDS = frozenset({
    "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
    "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act", "hidden_activation",
    "sliding_window", "sliding_window_size", "use_sliding_window", "max_window_layers",
    "layer_types",
    "partial_rotary_factor", "attn_logit_softcapping", "final_logit_softcapping",
    "num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
    "moe_intermediate_size", "shared_expert_intermediate_size", "n_shared_experts",
    "decoder_sparse_step", "mlp_only_layers", "first_k_dense_replace", "moe_layer_freq",
    "rope_theta", "rms_norm_eps", "architectures",
})

#: Fields that change no shape and no cost (ignored; the values of scales, token ids, training
#: settings, positions beyond the shapes lowered).
NON_COST_FIELDS = frozenset({
    "_name_or_path", "torch_dtype", "dtype", "transformers_version", "bos_token_id",
    "eos_token_id", "pad_token_id", "rope_scaling", "max_position_embeddings",
    "original_max_position_embeddings", "initializer_range", "use_cache", "attention_dropout",
    "hidden_dropout", "embd_pdrop", "resid_pdrop", "pretraining_tp", "query_pre_attn_scalar",
    "router_aux_loss_coef", "output_router_logits", "norm_topk_prob", "router_jitter_noise",
    "routed_scaling_factor", "scoring_func", "aux_loss_alpha", "seq_aux", "auto_map",
    "cache_implementation", "tokenizer_class", "attn_implementation", "use_return_dict",
    "return_dict", "output_attentions", "output_hidden_states", "torchscript",
})

#: Fields read approximately (a warning says how).
APPROXIMATED_FIELDS = {
    "n_group": "group-limited routing costed as uniform top-k over all routed experts",
    "topk_group": "group-limited routing costed as uniform top-k over all routed experts",
    "topk_method": "costed as uniform top-k routing (only 'greedy', plain top-k, is exact)",
    "quantization_config": "the file's quantization is not read: the widths come from "
                           "--weight-bits/--act-bits/--kv-bits",
}

#: Fields of architectures npujax does not model (refused, naming the field).
UNSUPPORTED_FIELDS = {
    "kv_lora_rank": "multi-head latent attention (DeepSeek-V2/V3)",
    "q_lora_rank": "multi-head latent attention (DeepSeek-V2/V3)",
    "qk_rope_head_dim": "multi-head latent attention (DeepSeek-V2/V3)",
    "text_config": "a multimodal model: pass the text model's own config.json",
    "vision_config": "a multimodal model: pass the text model's own config.json",
    "sliding_window_pattern": "Gemma 3's 5-local-1-global pattern",
    "cross_attention_layers": "cross-attention (Llama 3.2 Vision)",
    "num_nextn_predict_layers": "multi-token prediction layers",
    "linear_attn_config": "linear attention",
}


def shipped_decoders() -> dict[str, Path]:
    """``{name: path}`` of the ``config.json`` files shipped in ``npujax/models/configs/``."""
    root = resources.files("npujax.models") / "configs"
    return {p.name[:-5]: Path(str(p)) for p in root.iterdir() if p.name.endswith(".json")}


def load_decoder(name_or_path: str | os.PathLike[str], *,
                 ignore: Collection[str] = ()) -> DecoderConfig:
    """A decoder's shapes: a shipped name (:func:`shipped_decoders`: ``qwen2.5-0.5b``,
    ``llama-3.2-1b``, ``llama-3.1-8b``, ``tiny``) or a path to a ``config.json``.

    Raises:
      ConfigError: an unknown name, a missing or unreadable file, or what :func:`read_config`
        refuses.
    """
    shipped = shipped_decoders()
    s = str(name_or_path)
    if s in shipped:
        path = shipped[s]
    elif s.endswith(".json") or os.sep in s or Path(s).exists():
        path = Path(s)
        if path.is_dir():
            path = path / "config.json"
    else:
        raise ConfigError(f"unknown decoder config {s!r}; use one of {sorted(shipped)} or a "
                          "path to a Hugging Face config.json (decoder:path/to/config.json).")
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read decoder config {path}: {e.strerror or e}.") from e
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not JSON: {e}.") from e
    if not isinstance(fields, dict):
        raise ConfigError(f"{path} must hold a JSON object of config fields.")
    return read_config(fields, source=str(path.name if s in shipped else path), ignore=ignore)


def _int(f: Mapping[str, Any], key: str, where: str, default: Any = None) -> int:
    v = f.get(key)
    if v is None:  # absent or null: the family's default
        v = default
    if v is None:
        raise ConfigError(f"{where}: field {key!r} is required.")
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConfigError(f"{where}: field {key!r} must be a non-negative integer, got {v!r}.")
    return v


def read_config(fields: Mapping[str, Any], *, source: str = "config.json",
                ignore: Collection[str] = ()) -> DecoderConfig:
    """The :class:`~npujax.models.transformer.DecoderConfig` of a Hugging Face ``config.json``
    (already parsed; see the module docstring for the fields of each family).

    Args:
      fields: the JSON object.
      source: where it came from (messages, ``DecoderConfig.source``).
      ignore: further field names to ignore (the user states they change no shape).

    Raises:
      ConfigError: an unknown ``model_type``; a field npujax does not know (neither read nor on
        :data:`NON_COST_FIELDS`; the message names it); a field of an architecture npujax does
        not model (:data:`UNSUPPORTED_FIELDS`); a missing or mistyped size.
    """
    where = source
    mt = fields.get("model_type")
    if mt not in MODEL_TYPES:
        raise ConfigError(f"{where}: model_type {mt!r} is not one npujax reads; known: "
                          f"{', '.join(MODEL_TYPES)}. Another architecture's shapes would be "
                          "a guess.")
    for key in sorted(fields):
        if key in ignore or key in COST_FIELDS or key in NON_COST_FIELDS:
            continue
        if key == "topk_method" and fields[key] in ("greedy", None):
            continue  # plain top-k (DeepSeek-MoE): what the cost model assumes
        if key in APPROXIMATED_FIELDS:
            log.warning("%s: field %r read approximately: %s.", where, key,
                        APPROXIMATED_FIELDS[key])
        elif key in UNSUPPORTED_FIELDS:
            raise ConfigError(f"{where}: field {key!r} ({UNSUPPORTED_FIELDS[key]}) "
                              "changes the architecture in a way npujax does not model.")
        else:
            raise ConfigError(
                f"{where}: unknown field {key!r}; it may change the model's shapes, so npujax "
                "does not guess. If it changes no shape and no cost, ignore it with "
                f"--ignore-config-field {key} (API: load_decoder(..., ignore=({key!r},))).")
    d = _int(fields, "hidden_size", where)
    heads = _int(fields, "num_attention_heads", where)
    layers = _int(fields, "num_hidden_layers", where)
    kv_heads = _int(fields, "num_key_value_heads", where, heads)
    vocab = _int(fields, "vocab_size", where)
    head_dim = _int(fields, "head_dim", where, 0) or d // max(heads, 1)
    act = fields.get("hidden_activation") or fields.get("hidden_act") or "silu"
    if act in ("silu", "swish"):
        mlp = "swiglu"
    elif str(act).startswith("gelu"):
        mlp = "geglu"
    else:
        raise ConfigError(f"{where}: hidden_act {act!r} is not read (silu: SwiGLU, gelu*: "
                          "GeGLU).")
    gemma = mt in ("gemma", "gemma2")
    tied = bool(fields.get("tie_word_embeddings", gemma))
    qkv_bias = bool(fields.get("attention_bias", mt in ("qwen2", "qwen2_moe")))
    # sliding-window attention: which layers
    window = fields.get("sliding_window") or 0
    size = fields.get("sliding_window_size")
    if size is not None and window and size != window:
        raise ConfigError(f"{where}: sliding_window ({window}) and sliding_window_size "
                          f"({size}) differ; which one the model uses is unclear.")
    if window and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ConfigError(f"{where}: sliding_window must be a positive integer or null, got "
                          f"{window!r}.")
    local: tuple[int, ...] = ()
    if window:
        types = fields.get("layer_types")
        if types is not None:
            if len(types) != layers:
                raise ConfigError(f"{where}: layer_types has {len(types)} entries for "
                                  f"{layers} layers.")
            local = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
        elif mt == "gemma2":
            local = tuple(range(0, layers, 2))
        elif mt in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
            if fields.get("use_sliding_window", False):
                start = _int(fields, "max_window_layers", where, layers)
                local = tuple(range(start, layers))
        else:  # Mistral, Mixtral, Phi-3: every layer
            local = tuple(range(layers))
    rotary = float(fields.get("partial_rotary_factor", 1.0))
    rotary_dim = int(head_dim * rotary)
    rotary_dim -= rotary_dim % 2
    # mixture of experts
    experts = _int(fields, "num_local_experts", where, 0) or _int(fields, "num_experts", where, 0) \
        or _int(fields, "n_routed_experts", where, 0)
    k = _int(fields, "num_experts_per_tok", where, 0) if experts else 0
    ff = _int(fields, "intermediate_size", where)
    expert_ff, shared_ff = 0, 0
    moe_layers: tuple[int, ...] = ()
    if experts:
        if not 1 <= k <= experts:
            raise ConfigError(f"{where}: num_experts_per_tok ({k}) must be in [1, {experts}].")
        if mt == "mixtral":
            expert_ff, moe_layers = ff, tuple(range(layers))
        elif mt in ("qwen2_moe", "qwen3_moe"):
            expert_ff = _int(fields, "moe_intermediate_size", where)
            shared_ff = _int(fields, "shared_expert_intermediate_size", where, 0)
            step = _int(fields, "decoder_sparse_step", where, 1) or 1
            dense = set(fields.get("mlp_only_layers") or ())
            moe_layers = tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)
        elif mt == "deepseek":
            expert_ff = _int(fields, "moe_intermediate_size", where)
            shared_ff = _int(fields, "n_shared_experts", where, 0) * expert_ff
            first = _int(fields, "first_k_dense_replace", where, 0)
            freq = _int(fields, "moe_layer_freq", where, 1) or 1
            moe_layers = tuple(i for i in range(layers) if i >= first and i % freq == 0)
        else:
            raise ConfigError(f"{where}: model_type {mt!r} has no mixture of experts, but the "
                              "file names experts.")
    return DecoderConfig(
        vocab=vocab, d_model=d, heads=heads, kv_heads=kv_heads, d_ff=ff, layers=layers,
        rope_theta=float(fields.get("rope_theta", 10000.0)),
        norm_eps=float(fields.get("rms_norm_eps", 1e-6)), qkv_bias=qkv_bias,
        head_size=0 if heads and head_dim * heads == d else head_dim, mlp=mlp,
        mlp_bias=bool(fields.get("mlp_bias", False)),
        tied_embeddings=tied, embed_scale=gemma, sliding_window=int(window), local_layers=local,
        rotary_dim=rotary_dim if rotary_dim != head_dim else 0,
        qk_norm=mt in ("qwen3", "qwen3_moe"), sandwich_norms=mt == "gemma2",
        attn_softcap=bool(fields.get("attn_logit_softcapping")),
        final_softcap=bool(fields.get("final_logit_softcapping")),
        experts=experts, experts_per_token=k, expert_d_ff=expert_ff, shared_d_ff=shared_ff,
        shared_expert_gate=mt == "qwen2_moe" and shared_ff > 0, moe_layers=moe_layers,
        family=mt, source=f"{source} ({mt})")
