"""Register-level proof of the closed form on 60 random shapes per dataflow (six arrays; each
compiled once, the GEMMs padded to 18^3 and masked)."""

import pytest

from npujax.hw import DATAFLOWS
from tests.systolic.test_registers import PAD_TO, RANDOM_SHAPES, check_shapes


@pytest.mark.integration
@pytest.mark.parametrize("df", DATAFLOWS)
def test_register_simulation_many_shapes(df):
    check_shapes(df, RANDOM_SHAPES, pad_to=PAD_TO)
