"""Validation during training: the label-smoothed loss, NLL and perplexity on the valid split."""

from __future__ import annotations

import math

import torch

from transformer import dist
from transformer.data import BatchSampler, collate
from transformer.ids import PAD_ID
from transformer.model import Transformer
from transformer.sections.train import TrainConfig


@torch.no_grad()
def validate(model: Transformer, dataset, cfg: TrainConfig, device, autocast) -> dict[str, float]:
    """Label-smoothed loss, NLL and perplexity per target token on a split, summed over ranks."""
    model.eval()
    sampler = BatchSampler(
        dataset.src_lens, dataset.tgt_lens, cfg.max_tokens, cfg.seed, shuffle=False
    )
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for idx in list(sampler)[dist.rank() :: dist.world_size()]:  # each rank a disjoint share
        b = collate([dataset[j] for j in idx])
        tgt_out = b.tgt_out.to(device)
        with autocast():
            loss, nll = model.loss(
                b.src.to(device), b.tgt_in.to(device), tgt_out, cfg.label_smoothing
            )
        sums += torch.stack([loss.double(), nll.double(), tgt_out.ne(PAD_ID).sum().double()])
    loss, nll, n = dist.all_reduce_sum(sums).tolist()
    model.train()
    n = max(n, 1.0)
    return {"loss": loss / n, "nll": nll / n, "ppl": math.exp(min(nll / n, 50.0))}
