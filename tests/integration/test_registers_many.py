"""Register-level proof of the closed form on 40 random shapes per dataflow (slow: compiles)."""

import pytest

from npujax.hw import DATAFLOWS
from tests.systolic.test_registers import RANDOM_SHAPES, check_shapes


@pytest.mark.integration
@pytest.mark.parametrize("df", DATAFLOWS)
def test_register_simulation_many_shapes(df):
    check_shapes(df, RANDOM_SHAPES)
