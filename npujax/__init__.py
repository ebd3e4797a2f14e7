"""npujax: a differentiable NPU/TPU accelerator model in JAX.

One model graph, traced from Flax (:func:`trace_flax`) or imported from ONNX (:func:`from_onnx`),
serves quantization-aware training (:func:`quant_spec`, :func:`calibrate`, :func:`train_graph`,
or :func:`quantize_model` for QAT in the user's own Flax training loop),
mixed-precision search against the NPU latency model (:func:`search_precision`) and lowering to a
tiled NPU execution model (:func:`lower` on a :class:`NpuSpec` from :func:`load_npu_spec`).

The names below are the public API; they load on first use, so ``import npujax`` is instant and
``npujax.lower`` never imports ``onnx``. Subpackages hold the rest: :mod:`npujax.quant` (number
formats, fake-quant), :mod:`npujax.calib` (observers), :mod:`npujax.systolic` (dataflows,
emulator), :mod:`npujax.ops` (operator registry), :mod:`npujax.report` (tables, plots).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from npujax import _lazy
from npujax._version import __version__ as __version__

# The public API, each name once: type checkers and the docs read these imports; at run time
# _lazy.attach reads the same lines back and loads each name from its module on first use.
if TYPE_CHECKING:
    from npujax.backends.integer import IntegerModel as IntegerModel
    from npujax.backends.integer import convert as convert
    from npujax.backends.integer import execute_integer as execute_integer
    from npujax.backends.onnx_export import to_onnx as to_onnx
    from npujax.errors import NpujaxError as NpujaxError
    from npujax.explore.grid import Grid as Grid
    from npujax.explore.sweep import sweep as sweep
    from npujax.frontends.flax import trace_flax as trace_flax
    from npujax.frontends.onnx import from_onnx as from_onnx
    from npujax.hw.spec import NpuSpec as NpuSpec
    from npujax.hw.spec import list_presets as list_presets
    from npujax.hw.spec import load_npu_spec as load_npu_spec
    from npujax.ir.graph import Graph as Graph
    from npujax.ir.graph import Node as Node
    from npujax.ir.graph import TensorType as TensorType
    from npujax.ir.passes import fold_batchnorm as fold_batchnorm
    from npujax.ir.passes import fuse_epilogues as fuse_epilogues
    from npujax.ir.passes import optimize as optimize
    from npujax.ir.passes import rebatch as rebatch
    from npujax.plan.coresident import lower_models as lower_models
    from npujax.plan.lower import LayerReport as LayerReport
    from npujax.plan.lower import Schedule as Schedule
    from npujax.plan.lower import lower as lower
    from npujax.plan.memory import memory_report as memory_report
    from npujax.plan.pipeline import core_schedules as core_schedules
    from npujax.quant.formats import FloatFormat as FloatFormat
    from npujax.quant.formats import IntFormat as IntFormat
    from npujax.quantize.calibrate import calibrate as calibrate
    from npujax.quantize.execute import execute as execute
    from npujax.quantize.flax_model import QuantizedModel as QuantizedModel
    from npujax.quantize.flax_model import calibrate_model as calibrate_model
    from npujax.quantize.flax_model import graph_of as graph_of
    from npujax.quantize.flax_model import quantize_model as quantize_model
    from npujax.quantize.flax_model import write_back as write_back
    from npujax.quantize.model_file import load_graph as load_graph
    from npujax.quantize.model_file import save_graph as save_graph
    from npujax.quantize.ptq import bias_correction as bias_correction
    from npujax.quantize.ptq import layer_sqnr as layer_sqnr
    from npujax.quantize.ptq import ptq as ptq
    from npujax.quantize.quantizers import LSQ as LSQ
    from npujax.quantize.quantizers import STE as STE
    from npujax.quantize.quantizers import LSQPlus as LSQPlus
    from npujax.quantize.quantizers import Mixture as Mixture
    from npujax.quantize.quantizers import Quantizer as Quantizer
    from npujax.quantize.rules import QuantRule as QuantRule
    from npujax.quantize.rules import first_last_rules as first_last_rules
    from npujax.quantize.rules import quant_spec_from_rules as quant_spec_from_rules
    from npujax.quantize.spec import LayerQuant as LayerQuant
    from npujax.quantize.spec import QuantSpec as QuantSpec
    from npujax.quantize.spec import quant_spec as quant_spec
    from npujax.quantize.train import evaluate as evaluate
    from npujax.quantize.train import train_graph as train_graph
    from npujax.search.api import search_precision as search_precision
    from npujax.search.config import SearchConfig as SearchConfig
    from npujax.search.policy import PrecisionPolicy as PrecisionPolicy
    from npujax.search.policy import load_policy as load_policy
    from npujax.search.policy import save_policy as save_policy
    from npujax.search.report import SearchReport as SearchReport

if not TYPE_CHECKING:
    __getattr__, __dir__, __all__ = _lazy.attach(__name__, __file__)
