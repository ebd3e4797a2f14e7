"""Hardware descriptions: NpuSpec and the TOML preset loader."""

from npujax.hw.spec import DATAFLOWS as DATAFLOWS
from npujax.hw.spec import FUSION_LEVELS as FUSION_LEVELS
from npujax.hw.spec import LAYOUTS as LAYOUTS
from npujax.hw.spec import MAPPINGS as MAPPINGS
from npujax.hw.spec import PRECISION_SCALINGS as PRECISION_SCALINGS
from npujax.hw.spec import ArraySpec as ArraySpec
from npujax.hw.spec import HostSpec as HostSpec
from npujax.hw.spec import LayoutSpec as LayoutSpec
from npujax.hw.spec import MemorySpec as MemorySpec
from npujax.hw.spec import NpuSpec as NpuSpec
from npujax.hw.spec import OpsSpec as OpsSpec
from npujax.hw.spec import VectorSpec as VectorSpec
from npujax.hw.spec import as_spec as as_spec
from npujax.hw.spec import differentiable_spec as differentiable_spec
from npujax.hw.spec import list_presets as list_presets
from npujax.hw.spec import load_npu_spec as load_npu_spec
from npujax.hw.spec import npu_spec_from_dict as npu_spec_from_dict
from npujax.hw.spec import stack_specs as stack_specs

__all__ = [
    "ArraySpec",
    "MemorySpec",
    "VectorSpec",
    "LayoutSpec",
    "OpsSpec",
    "HostSpec",
    "LAYOUTS",
    "FUSION_LEVELS",
    "PRECISION_SCALINGS",
    "NpuSpec",
    "DATAFLOWS",
    "MAPPINGS",
    "load_npu_spec",
    "differentiable_spec",
    "npu_spec_from_dict",
    "list_presets",
    "stack_specs",
    "as_spec",
]
