"""Issue 14: DRAM fit verdicts (one model and co-resident), activation spills, argument checks."""

import pytest
from flax import nnx

from npujax.errors import ConfigError, NpujaxError
from npujax.models.cnn import DigitsCNN
from npujax.plan import lower, lower_models, memory_report
from tests.flax_graphs import traced


@pytest.fixture(scope="module")
def resnet(small_resnet):
    return small_resnet[0]


@pytest.fixture(scope="module")
def digits():
    return traced(DigitsCNN(rngs=nnx.Rngs(0)), (1, 8, 8, 1))[0]


def test_activations_alone_over_capacity_spill_activations(resnet, edge_spec):
    m = memory_report(resnet, lower(resnet, edge_spec), edge_spec)
    small = edge_spec.with_fields({"memory.dram_bytes": m.dram_activation_peak_bytes / 2})
    ms = memory_report(resnet, lower(resnet, small), small)
    assert not ms.fits and not ms.activations_fit
    # every weight goes to the host, and that is not enough: activations go too
    assert sum(b for _, b in ms.spill) == pytest.approx(ms.weight_bytes)
    assert ms.activation_spill
    assert sum(b for _, b in ms.activation_spill) >= ms.dram_activation_peak_bytes / 2
    assert ms.to_dict()["activation_spill"][0][0] == ms.activation_spill[0][0]
    # weights-only spill where the activations fit
    roomy = edge_spec.with_fields({"memory.dram_bytes": m.dram_activation_peak_bytes * 1.01})
    mr = memory_report(resnet, lower(resnet, roomy), roomy)
    assert not mr.fits and mr.activations_fit and mr.spill and mr.activation_spill == ()


def test_coresidency_flags_a_deployment_over_capacity(resnet, digits, edge_spec):
    graphs = {"resnet": resnet, "digits": digits}
    free = lower_models(graphs, edge_spec)
    assert free.fits and all(m.fits for m in free.models)
    act = free.models[0].memory.dram_activation_peak_bytes
    tight = edge_spec.with_fields({"memory.dram_bytes": act / 2})
    co = lower_models(graphs, tight)
    assert not co.models[0].fits and not co.fits
    assert co.to_dict()["fits"] is False and co.to_dict()["models"][0]["fits"] is False
    assert co.dram_held_bytes <= act / 2
    from rich.console import Console

    from npujax.report.lowering import print_coresidency

    con = Console(width=200, record=True)
    print_coresidency(con, co)
    text = con.export_text()
    assert "does NOT fit" in text and "its activations alone need" in text
    assert " fits " in text and " NO " in text  # the column and the verdict


def test_lower_models_rejects_arguments_it_would_ignore(resnet, digits, edge_spec):
    graphs = {"resnet": resnet, "digits": digits}
    with pytest.raises(ConfigError, match="resnt"):
        lower_models(graphs, edge_spec, {"resnt": None})
    spec = edge_spec.with_fields({"array.cores": 4})
    for cores in ([0, 4], [3, 3], [2, 2]):
        with pytest.raises(ConfigError, match="core_partitioned"):
            lower_models(graphs, spec, cores=cores)


def test_memory_report_of_another_graph_is_refused(resnet, digits, edge_spec):
    with pytest.raises(NpujaxError, match="graph the schedule was lowered from"):
        memory_report(digits, lower(resnet, edge_spec), edge_spec)
