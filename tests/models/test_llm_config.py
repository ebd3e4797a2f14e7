"""Decoders from Hugging Face config.json files: one hand-written model of each family, its
parameter count, the weight elements a decode step reads (from the built graph's workloads) and
the KV bytes per token, each against a closed form written here; unknown fields refused; the
expected-distinct-experts formula against a Monte Carlo of random routings; the graph built from
shapes equal to the traced Flax reference's."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from npujax.errors import ConfigError, LimitError
from npujax.models.decoders import decoder_graph
from npujax.models.hf_config import load_decoder, read_config
from npujax.models.moe import costed_experts, expected_experts, expert_loads
from npujax.models.serving import kv_bytes_per_token, weight_elems_per_step
from npujax.plan import workloads

V, D, L = 96, 64, 4  # vocabulary, hidden size, layers of every hand-written config

BASE = {"vocab_size": V, "hidden_size": D, "num_hidden_layers": L, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}

# family -> (config fields, head_dim, dense d_ff, tied, norms per block, qkv bias,
#            local layers, moe: (experts, k, expert_ff, shared_ff, gate, moe layers) or None)
FAMILIES = {
    "llama": ({"model_type": "llama", "tie_word_embeddings": False}, 16, 128, False, 2, False,
              (), None),
    "mistral": ({"model_type": "mistral", "sliding_window": 8}, 16, 128, False, 2, False,
                (0, 1, 2, 3), None),
    "qwen2": ({"model_type": "qwen2", "tie_word_embeddings": True, "use_sliding_window": False,
               "sliding_window": 4096, "max_window_layers": 4}, 16, 128, True, 2, True, (), None),
    "qwen3": ({"model_type": "qwen3", "head_dim": 32}, 32, 128, False, 2, False, (), None),
    "gemma": ({"model_type": "gemma", "head_dim": 32, "hidden_activation": "gelu_pytorch_tanh",
               "num_key_value_heads": 1}, 32, 128, True, 2, False, (), None),
    "gemma2": ({"model_type": "gemma2", "head_dim": 32, "hidden_activation":
                "gelu_pytorch_tanh", "sliding_window": 8, "query_pre_attn_scalar": 32,
                "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}, 32, 128, True,
               4, False, (0, 2), None),
    "phi3": ({"model_type": "phi3", "partial_rotary_factor": 0.5, "sliding_window": 2047},
             16, 128, False, 2, False, (0, 1, 2, 3), None),
    "mixtral": ({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2,
                 "router_aux_loss_coef": 0.02}, 16, 128, False, 2, False, (), (8, 2, 128, 0,
                                                                              False, (0, 1, 2, 3))),
    "qwen2_moe": ({"model_type": "qwen2_moe", "num_experts": 16, "num_experts_per_tok": 4,
                   "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
                   "decoder_sparse_step": 1, "mlp_only_layers": [0], "norm_topk_prob": False},
                  16, 128, False, 2, True, (), (16, 4, 32, 64, True, (1, 2, 3))),
    "deepseek": ({"model_type": "deepseek", "n_routed_experts": 16, "num_experts_per_tok": 6,
                  "moe_intermediate_size": 24, "n_shared_experts": 2,
                  "first_k_dense_replace": 1, "moe_layer_freq": 1}, 16, 128, False, 2, False,
                 (), (16, 6, 24, 48, False, (1, 2, 3))),
}


def _closed_forms(family, batch, kv_len, kv_bits):
    """(parameters, weight elements per decode step, KV bytes per token, GEMM MACs of the
    step), written out."""
    fields, hd, ff, tied, norms, bias, local, moe = FAMILIES[family]
    h, kv = 4, fields.get("num_key_value_heads", 2)
    attn = D * h * hd + 2 * D * kv * hd + h * hd * D
    params = V * D * (1 if tied else 2) + D  # embedding (+ head), final norm
    step = D * V  # the LM head
    macs = batch * D * V
    kv_bytes = 0.0
    for i in range(L):
        params += attn + norms * D + (hd * (h + 2 * kv) if bias else 0)
        params += 2 * hd if family == "qwen3" else 0  # the q and k head norms
        step += attn
        macs += batch * attn
        if moe and i in moe[5]:
            e, k, fe, fs, gate, _ = moe
            distinct = e * (1 - (1 - k / e) ** batch)
            params += e * 3 * D * fe + D * e + 3 * D * fs + (D if gate else 0)
            shared = D * e + 3 * D * fs + (D if gate else 0)  # router, shared expert, its gate
            step += round(distinct) * 3 * D * fe + shared
            macs += batch * (k * 3 * D * fe + shared)  # each token through its k experts
        else:
            params += 3 * D * ff
            step += 3 * D * ff
            macs += batch * 3 * D * ff
        w = fields.get("sliding_window") if i in local else None
        cached = min(kv_len, w - 1) if w else kv_len
        kv_bytes += 2 * kv * hd * cached * kv_bits / 8
        macs += 2 * batch * h * hd * (cached + 1)  # Q K^T and P V over the cache and the new key
    return params, step, kv_bytes, macs


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_shapes_against_closed_forms(family, tmp_path):
    fields = {**BASE, **FAMILIES[family][0]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fields))
    cfg = load_decoder(path)
    batch, kv_len = 3, 20
    params, step, kv_bytes, macs = _closed_forms(family, batch, kv_len, 4)
    assert cfg.parameters() == params
    g = decoder_graph(cfg, phase="decode", kv_len=kv_len, batch=batch)
    assert sum(w.macs for w in workloads(g) if w.kind == "gemm") == macs
    # the cache the graph reads (the constants each attention appends its new key/value to)
    cache = sum(g.tensors[t].size for n in g.nodes if n.op == "Concat" for t in n.inputs
                if t in g.constants)
    assert cache * 4 / 8 / batch == kv_bytes
    # weights read: the Gemms' kernels and the experts' batched MatMuls (constant operand)
    nodes = {n.name: n for n in g.nodes}
    read = sum(w.weight_elems for w in workloads(g) if w.name in nodes and (
        w.op == "Gemm" or (w.op == "MatMul" and nodes[w.name].inputs[1] in g.constants)))
    assert read == step
    moe = FAMILIES[family][7]
    ex = expected_experts(batch, moe[0], moe[1]) if moe else 0.0
    costed = round(ex) if moe else 0
    assert weight_elems_per_step(cfg, costed) == step
    assert kv_bytes_per_token(cfg, kv_len, 4) == kv_bytes


def test_unknown_unsupported_and_approximated_fields(caplog):
    base = {**BASE, "model_type": "llama"}
    with pytest.raises(ConfigError, match="unknown field 'attn_temperature'"):
        read_config({**base, "attn_temperature": 2.0})
    assert read_config({**base, "attn_temperature": 2.0}, ignore=("attn_temperature",))
    with pytest.raises(ConfigError, match="'kv_lora_rank'.*latent attention"):
        read_config({**base, "kv_lora_rank": 512})
    with pytest.raises(ConfigError, match="model_type 'mamba'"):
        read_config({**base, "model_type": "mamba"})
    with caplog.at_level(logging.WARNING):
        read_config({**base, "model_type": "deepseek", "n_routed_experts": 8,
                     "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_group": 2})
    assert "n_group" in caplog.text and "uniform top-k" in caplog.text


def test_shipped_configs_are_the_published_shapes():
    c = load_decoder("llama-3.1-8b")
    assert (c.d_model, c.d_ff, c.layers, c.heads, c.kv_heads, c.vocab) == \
        (4096, 14336, 32, 32, 8, 128256)
    assert c.parameters() == 8_030_261_248  # Meta's model card: 8.03 B
    q = load_decoder("qwen2.5-0.5b")
    assert q.tied_embeddings and q.qkv_bias and q.parameters() == 494_032_768  # 0.49 B


def test_expected_experts_against_monte_carlo():
    rng = np.random.default_rng(0)
    for e, k, n in ((8, 2, 4), (64, 6, 16), (60, 4, 1)):
        draws = 3000
        # each token picks k distinct experts uniformly: the first k of a random permutation
        picks = np.argsort(rng.random((draws, n, e)), axis=-1)[..., :k]
        distinct = np.array([len(np.unique(p)) for p in picks])
        sem = distinct.std() / np.sqrt(draws)
        assert abs(distinct.mean() - expected_experts(n, e, k)) < 4 * sem + 1e-9
    # measured loads: expert e chosen by a token with probability k f_e
    f = np.array([0.4, 0.3, 0.1, 0.1, 0.05, 0.05])
    k, n = 2, 3
    hits = np.zeros(10000)
    for i in range(hits.size):
        chosen = rng.random((n, f.size)) < k * f
        hits[i] = chosen.any(axis=0).sum()
    assert abs(hits.mean() - expected_experts(n, f.size, k, f)) < 4 * hits.std() / 100
    assert sum(g * m for g, m in expert_loads(5, 8, 2, f.tolist() + [0.0, 0.0])) == 10


def test_graph_from_shapes_is_the_traced_reference():
    import jax.numpy as jnp
    from flax import nnx

    from npujax.frontends.flax import trace_flax
    from npujax.ir.passes import optimize
    from npujax.models.transformer import DECODER_CONFIGS, Decoder

    cfg = DECODER_CONFIGS["tiny"]
    model = nnx.eval_shape(lambda: Decoder(cfg, phase="decode", kv_len=16, batch=2,
                                           rngs=nnx.Rngs(0)))
    traced = optimize(*trace_flax(model, jnp.zeros((2, 1), jnp.int32), check=False,
                                  weights="shapes"))[0]
    built = decoder_graph(cfg, phase="decode", kv_len=16, batch=2)
    sig = lambda g: [(n.name, n.op, dict(n.attrs), [g.tensors[t].shape for t in n.inputs])  # noqa: E731
                     for n in g.nodes]
    assert sig(built) == sig(traced)
    assert workloads(built) == workloads(traced)


def test_in_place_cache_reads_each_cached_element_once():
    """--kv-cache in_place: no Concat or Transpose of the cache; each attention MatMul reads
    its cache operand from a graph input in its own layout (the same operand, so --kv-bits
    applies as before), the new keys and values are graph outputs; the attention MatMuls'
    DRAM bytes are the copy graph's, and the step's DRAM is the copy graph's less the copies'
    traffic plus the new positions written. Sequences of two cache lengths and a sliding
    window (Mistral) included."""
    import dataclasses

    from npujax.hw import load_npu_spec
    from npujax.models.decoders import decoder_precision, kv_cache_operands
    from npujax.plan import lower

    path_cfg = {**BASE, **FAMILIES["mistral"][0], "num_hidden_layers": 2}
    cfg = dataclasses.replace(load_decoder("tiny"), layers=2)
    spec = load_npu_spec("edge_transformer_16x16")
    for c, lens in ((cfg, [24, 24, 40]), (path_cfg, [12, 12])):
        if isinstance(c, dict):
            import tempfile
            from pathlib import Path

            f = Path(tempfile.mkdtemp()) / "config.json"
            f.write_text(json.dumps(c))
            c = load_decoder(f)
        g = {k: decoder_graph(c, phase="decode", kv_lens=lens, kv_cache=k)
             for k in ("copy", "in_place")}
        ops = {k: [n.op for n in x.nodes] for k, x in g.items()}
        caches = [t for t in g["in_place"].inputs if "/kv_cache/" in t]
        groups = len(set(lens))
        assert len(caches) == 2 * c.layers * groups
        assert len(g["in_place"].outputs) == 1 + 2 * c.layers * groups
        # the cache Concats (2 per group and layer) and their Transposes are gone
        assert ops["copy"].count("Concat") - ops["in_place"].count("Concat") == len(caches)
        assert ops["copy"].count("Transpose") - ops["in_place"].count("Transpose") == len(caches)
        ops_c, ops_i = kv_cache_operands(g["copy"]), kv_cache_operands(g["in_place"])
        assert ops_c == ops_i and len(ops_i) == len(caches)
        window = min(max(lens), c.sliding_window - 1) if c.sliding_window else max(lens)
        assert max(g["in_place"].tensors[t].shape[2] for t in caches
                   if t.rsplit("/", 1)[1].startswith("k")) == window + 1
        low = {k: lower(x, spec, decoder_precision(x, 8, 8, 4)) for k, x in g.items()}
        mm = {k: {r.name: r.costs.dram_bytes for r in v.layers if r.name in ops_i}
              for k, v in low.items()}
        assert mm["copy"] == mm["in_place"]
        gc = g["copy"]
        copy_layers = {n.name for n in gc.nodes
                       if (n.op == "Concat" and any(t in gc.constants for t in n.inputs))
                       or n.name.split("/")[-1].startswith("matmul_a_transpose")}
        copies = sum(r.costs.dram_bytes for r in low["copy"].layers if r.name in copy_layers)
        # the new positions written: at most 4 bytes each, each tensor rounded to bursts
        new_kv = sum(gc.tensors[n.inputs[1]].size for n in gc.nodes if n.name in copy_layers
                     and n.op == "Concat")
        slack = 4 * new_kv + spec.layout.dram_burst_bytes * len(caches)
        assert (low["copy"].dram_bytes - copies <= low["in_place"].dram_bytes
                <= low["copy"].dram_bytes - copies + slack)
    with pytest.raises(ConfigError, match="kv_cache must be one of copy, in_place"):
        decoder_graph(cfg, phase="decode", kv_len=4, kv_cache="paged")


def test_capacity_error_and_serving_batch(capsys):
    from npujax.cli import main

    argv = ["lower", "decoder:llama-3.1-8b", "--phase", "decode", "--batch", "64",
            "--kv-len", "32768", "--npu", "datacenter_128x128", "--no-progress"]
    assert main(argv) == LimitError.exit_code
    err = capsys.readouterr().err
    assert "KV cache" in err and "memory.dram_bytes = 32.00 GiB" in err
    # a batch of per-sequence cache lengths (the API the command calls; no plots written)
    import dataclasses

    from npujax.hw import load_npu_spec
    from npujax.models.serving import lower_decoder

    cfg = dataclasses.replace(load_decoder("tiny"), layers=1)  # (a short cost program)
    lens = [40, 8, 8]
    result, rep = lower_decoder(cfg, load_npu_spec("edge_transformer_16x16"), phase="decode",
                                kv_lens=lens)
    assert rep.kv_lens == (8, 8, 40) and rep.batch == 3
    assert rep.kv_cache_bytes_per_token == pytest.approx(
        np.mean([kv_bytes_per_token(cfg, x, 8) for x in lens]))
    assert rep.tokens_per_s == pytest.approx(3 / result.schedule.latency_s)
    assert rep.to_dict()["ttft_s"] is None


def test_serving_arguments_refused_before_lowering(capsys):
    from npujax.cli import main

    for argv, message in (
            (["--phase", "decode", "--batch", "3", "--kv-len", "8,16"], "gives 2 lengths"),
            (["--phase", "prefill", "--kv-len", "8,16"], "decode step"),
            (["--phase", "prefill", "--kv-len", "1024"], "prompts are --seq-len"),
            (["--phase", "decode", "--prefill-chunk", "4"], "applies to --phase prefill"),
            (["--expert-loads", "0.5,0.5"], "tiny is dense"),
            (["--phase", "decode", "--kv-len", "eight"], "neither lengths"),
            (["--phase", "decode", "--kv-len", "512,-5"], "non-negative integers")):
        assert main(["lower", "decoder:tiny", "--no-progress", *argv]) == ConfigError.exit_code
        assert message in capsys.readouterr().err


def test_chunks_and_measured_loads_in_the_graph(tmp_path):
    fields = {**BASE, **FAMILIES["mixtral"][0]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fields))
    cfg = load_decoder(path)
    # a chunk of 8 prompt tokens after 16 (chunked prefill): its attention reads the 16
    g = decoder_graph(cfg, phase="prefill", seq_len=8, kv_lens=[16, 16], logits="none")
    cached = {g.tensors[t].shape for n in g.nodes if n.op == "Concat" for t in n.inputs
              if t in g.constants}
    assert cached == {(2, 16, 2, 16)} and "head" not in {n.name for n in g.nodes}
    # measured loads: expert 0 takes half the assignments of a batch of 4 top-2 tokens
    loads = [0.5, 0.2, 0.1, 0.1, 0.05, 0.05, 0.0, 0.0]
    g = decoder_graph(cfg, phase="decode", kv_len=4, batch=4, expert_loads=loads)
    experts = [n for n in g.nodes if n.op == "MatMul" and "/moe/" in n.name
               and n.name.startswith("blocks/0/")]
    tokens = sum(g.tensors[n.inputs[0]].shape[0] * g.tensors[n.inputs[0]].shape[1]
                 for n in experts) // 3  # gate, up, down per class
    assert tokens == 4 * 2
    touched = sum(g.tensors[n.inputs[1]].shape[0] for n in experts) // 3
    assert touched == round(expected_experts(4, 8, 2, loads))


@pytest.mark.parametrize("name, parameters, rel", [
    ("gemma-2-9b", 9_241_705_984, 0),  # google/gemma-2-9b's safetensors: 9,241,705,984
    ("deepseek-moe-16b-base", 16.4e9, 5e-3),  # deepseek-ai/deepseek-moe-16b-base: 16.4 B
    ("qwen1.5-moe-a2.7b", 14.3e9, 5e-3),  # Qwen/Qwen1.5-MoE-A2.7B: 14.3 B in total
])
def test_published_configs_read_whole(name, parameters, rel):
    """The config.json files as published (every field), their model cards' parameter counts."""
    from pathlib import Path

    cfg = load_decoder(Path(__file__).parent / "published" / f"{name}.json")
    assert cfg.parameters() == pytest.approx(parameters, rel=rel)


def test_costed_expert_counts_weigh_to_the_expected_weight_bytes(tmp_path):
    """The two whole expert counts a MoE step is costed at, weighted, read exactly the expected
    weight elements (E[distinct] experts' worth); each routes every assignment."""
    fields = {**BASE, **FAMILIES["qwen2_moe"][0]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fields))
    cfg = load_decoder(path)
    batch = 3
    ex = expected_experts(batch, 16, 4)  # 16 (1 - (12/16)^3) = 9.25
    mix = costed_experts(batch, 16, 4)
    assert [d for d, _ in mix] == [9, 10] and sum(d * w for d, w in mix) == pytest.approx(ex)
    read = 0.0
    for d, w in mix:
        g = decoder_graph(cfg, phase="decode", kv_len=8, batch=batch, experts_touched=d)
        nodes = {n.name: n for n in g.nodes}
        read += w * sum(wl.weight_elems for wl in workloads(g) if wl.name in nodes and (
            wl.op == "Gemm" or (wl.op == "MatMul" and nodes[wl.name].inputs[1] in g.constants)))
    assert read == pytest.approx(weight_elems_per_step(cfg, ex), rel=1e-12)
    assert costed_experts(1, 8, 2) == ((2, 1.0),)  # one token: exactly k experts
