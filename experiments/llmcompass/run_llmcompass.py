"""Run LLMCompass's transformer blocks and print their per-operator latencies as JSON.

Runs inside LLMCompass's own environment (``/work/venv-llmcompass``) with its source tree as
the working directory (it reads ``systolic_array_model/look_up_table_16_16.csv`` relative to
it); ``compare.py`` starts it as a subprocess. Never imported by npujax.

Usage: python run_llmcompass.py CONFIG.json CASES.json  (CASES: a list of
``{"model", "d_model", "n_heads", "phase", "batch", "seq_len"}``; ``seq_len`` is the prompt
length of a prefill or the cached length of a decode step). Prints one JSON list.

LLMCompass imports PyTorch at module level only for ``run_on_gpu`` (timing a real GPU) and to
decorate those GPU kernels with ``torch.compile``; its simulator (``compile_and_simulate``)
does not use it. PyTorch's CPU build is not on the registries this workplace reaches, so a
placeholder module stands in: ``torch.compile`` returns the function unchanged and any other
use raises, so a simulation that touched PyTorch would fail loudly rather than give a number.
"""
import contextlib
import json
import os
import sys
import time
import types


def _torch_placeholder():
    mod = types.ModuleType("torch")

    class _Absent:
        def __init__(self, *a, **k):
            raise RuntimeError("PyTorch is not installed: LLMCompass's run_on_gpu is not used")

    mod.compile = lambda f=None, **k: f if f is not None else (lambda g: g)
    mod.Tensor = _Absent
    mod.float16 = mod.float32 = None

    def __getattr__(name):
        raise RuntimeError(f"torch.{name} used: PyTorch is not installed here (placeholder)")

    mod.__getattr__ = __getattr__
    return mod


sys.modules.setdefault("torch", _torch_placeholder())
sys.path.insert(0, os.getcwd())

from design_space_exploration.dse import read_architecture_template, template_to_system  # noqa: E402
from software_model.transformer import (  # noqa: E402
    TransformerBlockAutoRegressionTP,
    TransformerBlockInitComputationTP,
)
from software_model.utils import Tensor, data_type_dict  # noqa: E402

#: The order of TransformerBlock*.simluate_log (software_model/transformer.py).
LOG_FIELDS = ("qkv_proj", "q_mul_k", "a_mul_v", "o_proj", "ffn_up", "ffn_down", "softmax",
              "layernorm0", "layernorm1", "gelu", "allreduce_mha", "allreduce_ffn")


def run(config_path, cases):
    system = template_to_system(read_architecture_template(config_path))
    ov = system.device.compute_module.overhead
    overhead = {"qkv_proj": 3 * ov.matmul, "q_mul_k": ov.matmul, "a_mul_v": ov.matmul,
                "o_proj": ov.matmul, "ffn_up": ov.matmul, "ffn_down": ov.matmul,
                "softmax": ov.softmax, "layernorm0": ov.layernorm, "layernorm1": ov.layernorm,
                "gelu": ov.gelu, "allreduce_mha": 0.0, "allreduce_ffn": 0.0}
    fp16 = data_type_dict["fp16"]
    out = []
    for c in cases:
        d, h, b, s = c["d_model"], c["n_heads"], c["batch"], c["seq_len"]
        t0 = time.perf_counter()
        if c["phase"] == "prefill":
            block = TransformerBlockInitComputationTP(d_model=d, n_heads=h, device_count=1,
                                                      data_type=fp16)
            block(Tensor([b, s, d], fp16))
        else:
            block = TransformerBlockAutoRegressionTP(d_model=d, n_heads=h, device_count=1,
                                                     data_type=fp16)
            block(Tensor([b, 1, d], fp16), s)
        total = block.compile_and_simulate(system, "heuristic-GPU")
        values = [float(v) for v in block.simluate_log.split(",")]
        ops = dict(zip(LOG_FIELDS, values))
        out.append({**c, "latency_s": float(total), "ops_s": ops, "overhead_s": overhead,
                    "wall_s": time.perf_counter() - t0})
        print(f"llmcompass: {c['model']} {c['phase']} b={b} s={s}: {total * 1e3:.3f} ms "
              f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    return out


if __name__ == "__main__":
    config, cases_file = sys.argv[1], sys.argv[2]
    with open(cases_file) as f:
        cases = json.load(f)
    with contextlib.redirect_stdout(sys.stderr):  # LLMCompass prints its progress
        results = run(config, cases)
    json.dump(results, sys.stdout)
