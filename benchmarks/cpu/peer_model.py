"""The project's model at a shape of the peers harness (../shared/bench/peers), built one way for
both adapters (peer_adapter.py trains it, decode_adapter.py decodes with it)."""

import torch

from transformer.core.sections.model import ModelConfig
from transformer.model.network import Transformer


def model_config(shape: dict, paper: bool = False) -> ModelConfig:
    """paper: without the attention and activation dropout the shared workload adds (the paper
    has residual dropout only, §5.4)."""
    assert shape["enc_layers"] == shape["dec_layers"] and shape["tied"]
    return ModelConfig(
        d_model=shape["d_model"],
        d_ff=shape["ff"],
        n_heads=shape["heads"],
        n_layers=shape["enc_layers"],
        dropout=shape["dropout"],
        attention_dropout=0.0 if paper else shape.get("attention_dropout", 0.0),
        activation_dropout=0.0 if paper else shape.get("activation_dropout", 0.0),
    )


def build_model(shape: dict, paper: bool = False) -> Transformer:
    """The same weights in every sample (seeded)."""
    torch.manual_seed(0)
    return Transformer(model_config(shape, paper), shape["vocab"])
