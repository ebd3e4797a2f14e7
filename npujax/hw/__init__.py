"""Hardware descriptions: NpuSpec, the TOML preset loader, its field paths, energy per action
and area."""

from npujax.hw import fields as fields
from npujax.hw.energy import AreaBreakdown as AreaBreakdown
from npujax.hw.energy import area_breakdown as area_breakdown
from npujax.hw.energy import area_mm2 as area_mm2
from npujax.hw.energy import mac_energy_pj as mac_energy_pj
from npujax.hw.energy import sram_pj_per_byte as sram_pj_per_byte
from npujax.hw.spec import ATTENTION_FUSIONS as ATTENTION_FUSIONS
from npujax.hw.spec import DATAFLOWS as DATAFLOWS
from npujax.hw.spec import FALLBACK_SCOPES as FALLBACK_SCOPES
from npujax.hw.spec import FUSION_LEVELS as FUSION_LEVELS
from npujax.hw.spec import GROUP_PACKINGS as GROUP_PACKINGS
from npujax.hw.spec import LAYOUTS as LAYOUTS
from npujax.hw.spec import MAPPINGS as MAPPINGS
from npujax.hw.spec import PARAMETER_CACHES as PARAMETER_CACHES
from npujax.hw.spec import PRECISION_SCALINGS as PRECISION_SCALINGS
from npujax.hw.spec import STATIONARY_BUFFERINGS as STATIONARY_BUFFERINGS
from npujax.hw.spec import UNSUPPORTED_POLICIES as UNSUPPORTED_POLICIES
from npujax.hw.spec import AreaSpec as AreaSpec
from npujax.hw.spec import ArraySpec as ArraySpec
from npujax.hw.spec import EnergySpec as EnergySpec
from npujax.hw.spec import HostSpec as HostSpec
from npujax.hw.spec import LayoutSpec as LayoutSpec
from npujax.hw.spec import MemorySpec as MemorySpec
from npujax.hw.spec import NpuSpec as NpuSpec
from npujax.hw.spec import OpsSpec as OpsSpec
from npujax.hw.spec import TechnologySpec as TechnologySpec
from npujax.hw.spec import ThermalSpec as ThermalSpec
from npujax.hw.spec import VectorSpec as VectorSpec
from npujax.hw.spec import as_spec as as_spec
from npujax.hw.spec import differentiable_spec as differentiable_spec
from npujax.hw.spec import list_presets as list_presets
from npujax.hw.spec import load_npu_spec as load_npu_spec
from npujax.hw.spec import npu_spec_from_dict as npu_spec_from_dict
from npujax.hw.spec import spec_to_toml as spec_to_toml
from npujax.hw.spec import stack_specs as stack_specs

__all__ = [
    "fields",
    "ATTENTION_FUSIONS",
    "ArraySpec",
    "MemorySpec",
    "VectorSpec",
    "LayoutSpec",
    "OpsSpec",
    "HostSpec",
    "TechnologySpec",
    "ThermalSpec",
    "EnergySpec",
    "AreaSpec",
    "AreaBreakdown",
    "area_breakdown",
    "area_mm2",
    "mac_energy_pj",
    "sram_pj_per_byte",
    "LAYOUTS",
    "FALLBACK_SCOPES",
    "UNSUPPORTED_POLICIES",
    "FUSION_LEVELS",
    "GROUP_PACKINGS",
    "STATIONARY_BUFFERINGS",
    "PRECISION_SCALINGS",
    "PARAMETER_CACHES",
    "NpuSpec",
    "DATAFLOWS",
    "MAPPINGS",
    "load_npu_spec",
    "differentiable_spec",
    "npu_spec_from_dict",
    "list_presets",
    "stack_specs",
    "as_spec",
    "spec_to_toml",
]
