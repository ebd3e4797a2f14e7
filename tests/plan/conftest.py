"""Fixtures of the cost-model tests: the model kinds every consumer is checked on."""

import pytest


@pytest.fixture(scope="session")
def model_kinds(small_resnet):
    """``{kind: optimized graph}``: a residual CNN and a ViT block built as
    ``experiments/published_numbers.py`` builds them (the recorded figures' models), and one
    decode step of a one-block tiny decoder (16 cached positions)."""
    import dataclasses

    from flax import nnx

    from npujax.models.decoders import decoder_graph
    from npujax.models.transformer import DECODER_CONFIGS, ViT
    from tests.flax_graphs import traced

    vit = traced(ViT(image=8, patch=4, d_model=16, heads=2, d_ff=32, layers=1,
                     rngs=nnx.Rngs(0)), (1, 8, 8, 1))[0]
    return {"resnet": small_resnet[0], "vit": vit,
            "decoder": decoder_graph(dataclasses.replace(DECODER_CONFIGS["tiny"], layers=1),
                                     phase="decode", seq_len=1, kv_len=16, batch=1)}
