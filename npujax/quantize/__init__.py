"""Quantization applied to a Graph: the precision vocabulary (specs, rules), the quantizers and
their typed states, fake-quant execution, calibration, PTQ, QAT training and the model file,
and QAT in the user's own Flax training loop (:mod:`.flax_model`, loaded on first use: it
imports flax, which the rest of the package and its users, such as ``npujax.lower``, do not;
QAT training, :mod:`.train`, is loaded on first use too: it imports optax)."""

from typing import TYPE_CHECKING

from npujax import _lazy
from npujax.ir.execute import execute as execute
from npujax.quantize.calibrate import calibrate as calibrate
from npujax.quantize.model_file import load_graph as load_graph
from npujax.quantize.model_file import save_graph as save_graph
from npujax.quantize.parallel import DataParallel as DataParallel
from npujax.quantize.parallel import data_parallel as data_parallel
from npujax.quantize.ptq import bias_correction as bias_correction
from npujax.quantize.ptq import layer_sqnr as layer_sqnr
from npujax.quantize.ptq import ptq as ptq
from npujax.quantize.quantizers import LSQ as LSQ
from npujax.quantize.quantizers import QUANTIZERS as QUANTIZERS
from npujax.quantize.quantizers import STE as STE
from npujax.quantize.quantizers import LSQPlus as LSQPlus
from npujax.quantize.quantizers import Mixture as Mixture
from npujax.quantize.quantizers import QState as QState
from npujax.quantize.quantizers import Quantizer as Quantizer
from npujax.quantize.quantizers import get_quantizer as get_quantizer
from npujax.quantize.quantizers import init_states as init_states
from npujax.quantize.rules import QuantRule as QuantRule
from npujax.quantize.rules import first_last_rules as first_last_rules
from npujax.quantize.rules import quant_spec_from_rules as quant_spec_from_rules
from npujax.quantize.spec import LayerQuant as LayerQuant
from npujax.quantize.spec import QuantSpec as QuantSpec
from npujax.quantize.spec import quant_spec as quant_spec

if TYPE_CHECKING:  # loaded on first use: flax_model imports flax, train optax (0.2 s)
    from npujax.quantize.flax_model import QuantizedModel as QuantizedModel
    from npujax.quantize.flax_model import calibrate_model as calibrate_model
    from npujax.quantize.flax_model import graph_of as graph_of
    from npujax.quantize.flax_model import quantize_model as quantize_model
    from npujax.quantize.flax_model import write_back as write_back
    from npujax.quantize.train import TrainConfig as TrainConfig
    from npujax.quantize.train import TrainResult as TrainResult
    from npujax.quantize.train import batch_iterator as batch_iterator
    from npujax.quantize.train import cross_entropy as cross_entropy
    from npujax.quantize.train import evaluate as evaluate
    from npujax.quantize.train import train_graph as train_graph

__all__ = ["LayerQuant", "QuantSpec", "quant_spec", "QuantRule", "quant_spec_from_rules",
           "first_last_rules", "Quantizer", "QUANTIZERS", "get_quantizer", "STE", "LSQ",
           "LSQPlus", "Mixture", "QState", "init_states", "execute", "calibrate", "ptq",
           "bias_correction", "layer_sqnr", "train_graph", "TrainConfig", "TrainResult",
           "evaluate", "cross_entropy", "batch_iterator", "save_graph", "load_graph",
           "DataParallel", "data_parallel", "quantize_model", "calibrate_model", "graph_of",
           "write_back", "QuantizedModel"]

if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy.attach(__name__, __file__)[:2]  # __all__ above, for the docs
