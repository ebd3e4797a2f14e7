"""npujax: a differentiable NPU/TPU accelerator model in JAX.

One model graph, traced from Flax (:func:`trace_flax`) or Keras 3 (:func:`trace_keras`) or
imported from ONNX (:func:`from_onnx`), serves quantization-aware training (:func:`quant_spec`,
:func:`calibrate`, :func:`train_graph`, or :func:`quantize_model` for QAT in the user's own Flax
training loop), mixed-precision search against the NPU latency model (:func:`search_precision`)
and lowering to a tiled NPU execution model (:func:`lower` on a :class:`NpuSpec` from
:func:`load_npu_spec`).

The names below are the entry points and the data types a user passes around; they load on
first use, so ``import npujax`` imports no dependency and ``npujax.lower`` never imports ``onnx``.
Everything else is one dot away, in the subpackage of its pipeline stage: :mod:`npujax.ir` (the
Graph's nodes, passes), :mod:`npujax.quantize` (PTQ helpers, more quantizers, the Flax-model
QAT helpers), :mod:`npujax.numerics` (number formats, fake-quant), :mod:`npujax.calib` (observers),
:mod:`npujax.backends` (integer execution), :mod:`npujax.hw` (hardware fields, energy),
:mod:`npujax.plan` (per-layer costs and reports, memory, multi-core pipelines),
:mod:`npujax.search` (reports, policy files, searchers), :mod:`npujax.explore` (design-space
sweeps), :mod:`npujax.systolic` (dataflows, emulator), :mod:`npujax.ops` (operator registry)
and :mod:`npujax.report` (tables, plots).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from npujax import _lazy
from npujax._version import __version__ as __version__

# The public API, each name once: type checkers and the docs read these imports; at run time
# _lazy.attach reads the same lines back and loads each name from its module on first use.
if TYPE_CHECKING:
    from npujax.backends.integer import convert as convert
    from npujax.backends.onnx_export import to_onnx as to_onnx
    from npujax.errors import NpujaxError as NpujaxError
    from npujax.explore.grid import Grid as Grid
    from npujax.explore.sweep import sweep as sweep
    from npujax.frontends.flax import trace_flax as trace_flax
    from npujax.frontends.keras import trace_keras as trace_keras
    from npujax.frontends.onnx import from_onnx as from_onnx
    from npujax.hw.spec import NpuSpec as NpuSpec
    from npujax.hw.spec import list_presets as list_presets
    from npujax.hw.spec import load_npu_spec as load_npu_spec
    from npujax.ir.execute import execute as execute
    from npujax.ir.execute import inference as inference
    from npujax.ir.graph import Graph as Graph
    from npujax.ir.passes import optimize as optimize
    from npujax.ir.passes import rebatch as rebatch
    from npujax.plan.coresident import lower_models as lower_models
    from npujax.plan.lower import Schedule as Schedule
    from npujax.plan.lower import lower as lower
    from npujax.quantize.calibrate import calibrate as calibrate
    from npujax.quantize.flax_model import QuantizedModel as QuantizedModel
    from npujax.quantize.flax_model import quantize_model as quantize_model
    from npujax.quantize.model_file import load_graph as load_graph
    from npujax.quantize.model_file import save_graph as save_graph
    from npujax.quantize.ptq import ptq as ptq
    from npujax.quantize.quantizers import LSQ as LSQ
    from npujax.quantize.quantizers import STE as STE
    from npujax.quantize.quantizers import Quantizer as Quantizer
    from npujax.quantize.rules import QuantRule as QuantRule
    from npujax.quantize.rules import quant_spec_from_rules as quant_spec_from_rules
    from npujax.quantize.spec import LayerQuant as LayerQuant
    from npujax.quantize.spec import QuantSpec as QuantSpec
    from npujax.quantize.spec import quant_spec as quant_spec
    from npujax.quantize.train import TrainConfig as TrainConfig
    from npujax.quantize.train import train_graph as train_graph
    from npujax.search.api import search_precision as search_precision
    from npujax.search.config import SearchConfig as SearchConfig
    from npujax.search.policy import PrecisionPolicy as PrecisionPolicy

if not TYPE_CHECKING:
    __getattr__, __dir__, __all__ = _lazy.attach(__name__, __file__)
