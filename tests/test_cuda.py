"""On a CUDA GPU (skipped without one): exact SIGKILL resume in bf16 (the captured update, static
shapes) and in fp16 with gradient scaling (eager), the captured update = the eager one, the
compiled loss inside the graphs, updates that never wait for the GPU, decoding on the GPU as on
the CPU, and the fused output loss there.

benchmarks/gpu/check.py runs this file on a lent GPU with `pytest --noconftest`: that machine
has no Prefect, DVC, Babel or num2words, so nothing here needs tests/conftest.py, and the corpus
is written as raw text (not the synthetic download) before the real tokenizer and shard stages.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers.decode import copy_model, model_files, sources, translate_file  # noqa: F401
from helpers.train import MODEL, TRAIN, kill_and_resume, write_params
from torch.profiler import ProfilerActivity, profile

from transformer import shard, tokenizer, train
from transformer.core.sections.decode import DecodeConfig
from transformer.core.sections.model import ModelConfig
from transformer.core.sections.train import TrainConfig
from transformer.data.batches import BatchSampler, load_split
from transformer.data.vocab import load_tokenizer
from transformer.model import checkpoint, ops, precision
from transformer.model.beam import beam_search, translate_ids
from transformer.model.incremental import Decoder
from transformer.model.network import Transformer
from transformer.model.ops import output_loss
from transformer.training.clock import Clock
from transformer.training.learner import update_text
from transformer.training.losses import LossSums

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
WORDS = [
    "cat",
    "dog",
    "bird",
    "sun",
    "tree",
    "house",
    "river",
    "green",
    "small",
    "old",
    "red",
    "blue",
    "runs",
    "sees",
    "eats",
    "likes",
    "the",
    "a",
    "and",
    "on",
    "in",
    "near",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Raw pairs (a word-for-word code) through the real tokenizer and shard stages."""
    d = tmp_path_factory.mktemp("corpus")
    p = str(write_params(d / "params.yaml"))
    rng = random.Random(0)
    (d / "raw").mkdir()
    for split, n in (("train", 300), ("valid", 30), ("test", 10)):
        src = [" ".join(rng.choices(WORDS, k=rng.randint(3, 12))) for _ in range(n)]
        (d / "raw" / f"{split}.en").write_text("".join(s + "\n" for s in src))
        (d / "raw" / f"{split}.de").write_text("".join(s[::-1] + "\n" for s in src))
    tokenizer.main([str(d / "raw"), str(d / "tok"), "--params", p])
    shard.main([str(d / "raw"), str(d / "tok"), str(d / "shards"), "--params", p])
    return d


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_sigkill_then_resume_is_bit_exact_on_the_gpu(corpus, tmp_path, precision):
    out = kill_and_resume(corpus, tmp_path, precision=precision)
    assert f"training in {precision} on cuda" in out
    # train.static_shapes / graphs auto: bf16 resumes exactly on the captured path; fp16 is eager
    assert update_text(graphs=precision == "bf16", static=True) in out
    ckpt = checkpoint.load(checkpoint.step_path(tmp_path / "full", 40))
    if precision == "fp16":  # gradient scaling ran, and its state is what resumed
        assert ckpt["scaler"]["scale"] > 0
    else:
        assert ckpt["scaler"] is None


@pytest.mark.parametrize("beam_size", [1, 4])
def test_fp32_decoding_on_the_gpu_is_the_cpus(copy_model, sources, beam_size):  # noqa: F811
    cap = torch.full((len(sources),), 12)
    ref = beam_search(Decoder(copy_model), sources, beam_size, 0.6, cap)
    gpu = Decoder(copy_model, device="cuda")
    assert gpu.model.output_weight.is_cuda
    assert beam_search(gpu, sources, beam_size, 0.6, cap) == ref
    assert beam_search(gpu, sources, beam_size, 0.6, cap, use_cache=False) == ref


def test_bf16_decoding_on_the_gpu_mostly_agrees(copy_model, sources):  # noqa: F811
    srcs = [r[r.ne(0)].tolist() for r in sources]
    ref = translate_ids(Decoder(copy_model), srcs, DecodeConfig())
    got = translate_ids(Decoder(copy_model, "bf16", device="cuda"), srcs, DecodeConfig())
    assert sum(a == b for a, b in zip(ref, got)) >= len(srcs) // 2


def test_translate_cli_on_the_gpu(model_files, tmp_path):  # noqa: F811
    model, tok = model_files
    src = tmp_path / "in.txt"
    src.write_text("the cat sat\n\nwe read a book\n")
    cpu, gpu = (
        translate_file(
            model, tok, src, tmp_path / f"{device}.txt", "--beam-size", "2", "--device", device
        )
        for device in ("cpu", "cuda")
    )
    assert cpu == gpu


@pytest.mark.parametrize("fused", [True, False])
def test_output_loss_on_the_gpu(fused, monkeypatch):
    monkeypatch.setattr(ops, "CHUNK_ELEMENTS_GPU", 50 * 16)  # 16 rows: many chunks
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(37, 8, device="cuda", generator=g, requires_grad=True)
    w = torch.randn(50, 8, device="cuda", generator=g, requires_grad=True)
    y = torch.randint(0, 50, (37,), device="cuda", generator=g)
    loss, nll = output_loss(h, w, y, 0.1, fused)
    ref = F.cross_entropy(h @ w.T, y, label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close((loss, nll), (ref, F.cross_entropy(h @ w.T, y, reduction="sum")))
    grads = torch.autograd.grad(2.0 * loss, (h, w))
    torch.testing.assert_close(grads, torch.autograd.grad(2.0 * ref, (h, w)), rtol=1e-4, atol=1e-5)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        low, _ = output_loss(h, w, y, 0.1, fused)
    torch.testing.assert_close(low, ref, rtol=2e-2, atol=0.0)


def cuda_learner(corpus: Path, mcfg: ModelConfig, tcfg: TrainConfig, **path):
    """The train stage's Learner on the corpus, and its batch stream (as train() builds them)."""
    device = torch.device("cuda")
    vocab = load_tokenizer(corpus / "tok").size
    data, valid = load_split(corpus / "shards", "train"), load_split(corpus / "shards", "valid")
    torch.manual_seed(tcfg.seed)
    learner = train.Learner(
        mcfg,
        tcfg,
        vocab,
        train.output_ids(mcfg, vocab, data, valid),
        device,
        precision.resolve_precision(tcfg.precision, device, "train.precision"),
        **path,
    )
    sampler = BatchSampler(
        data.src_lens,
        data.tgt_lens,
        tcfg.max_tokens,
        tcfg.seed,
        static=path.get("static", False),
        group=tcfg.update_freq,
    )
    return learner, sampler, train.batch_stream(data, sampler)


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"precision": "bf16", "clip_norm": 1.0, "update_freq": 2, "output_vocab": "target"},
        {
            "precision": "fp16",
            "fused_adam": True,
            "clip_norm": 1.0,
        },  # GradScaler syncs unless fused
        {"precision": "bf16", "clip_norm": 1.0, "update_freq": 2, "graphs": True},
    ],
)
def test_updates_between_log_points_never_wait_for_the_gpu(corpus, over):
    """What the loop does between log, validation and checkpoint points (batches, the clock's
    collective, the rate, the update, the loss sums) makes no host<->device sync: the host
    queues updates ahead of the GPU. CUDA's sync debug mode makes any sync an error. Captured:
    once every shape is captured (a capture itself syncs), replays never wait either."""
    mcfg = ModelConfig(**MODEL, output_vocab=over.get("output_vocab", "shared"))
    skip = ("output_vocab", "graphs")
    tcfg = TrainConfig(**{**TRAIN, **{k: v for k, v in over.items() if k not in skip}})
    graphs = over.get("graphs", False)
    learner, sampler, stream = cuda_learner(corpus, mcfg, tcfg, static=graphs, graphs=graphs)
    clock = Clock(tcfg, 0, 0.0, finished=False)
    losses = LossSums(learner.sums, 0)
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}

    def update(step: int) -> None:  # as train() does it
        batches = [next(stream) for _ in range(tcfg.update_freq)]
        n_tokens = clock.tick(step, sum(train.n_targets(b) for _, b in batches))
        lr = train.rate(step, tcfg, mcfg.d_model, clock.progress(step - 1))
        learner.step([b for _, b in batches], n_tokens, lr)
        losses.add(n_tokens)

    # the first update creates Adam's state and CUDA's workspaces; with graphs, 3 epochs
    # warm up and capture every shape
    first = 1 + (3 * len(sampler) // tcfg.update_freq if graphs else 0)
    for step in range(1, first + 1):
        update(step)
    if graphs:
        assert len(learner.graphs.graphs) == sampler.stats["batch_shapes"]
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(first + 1, first + 5):
            update(step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    losses.read(first + 4)  # a log point: the sums are read, and finite
    assert losses.take()["train/loss"] > 0
    after = learner.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained


@pytest.mark.parametrize("over", [{}, {"update_freq": 2, "clip_norm": 1.0}])
def test_the_captured_update_is_the_eager_update(corpus, over):
    """fp32, no dropout: the replayed graphs compute what the eager update computes, update
    after update, over shapes met in any order (each captured at its third update)."""
    mcfg = ModelConfig(**{**MODEL, "dropout": 0.0})
    tcfg = TrainConfig(**{**TRAIN, "precision": "fp32", **over})
    eager, sampler, stream = cuda_learner(corpus, mcfg, tcfg, static=True)
    captured, _, _ = cuda_learner(corpus, mcfg, tcfg, static=True, graphs=True)
    steps = 3 * len(sampler) // tcfg.update_freq + 3
    for step in range(1, steps + 1):
        batches = [b for _, b in (next(stream) for _ in range(tcfg.update_freq))]
        n = float(sum(train.n_targets(b) for b in batches))
        lr = train.rate(step, tcfg, mcfg.d_model)
        for learner in (eager, captured):
            learner.step(batches, n, lr)
    assert len(captured.graphs.graphs) == sampler.stats["batch_shapes"] > 1
    for (name, a), b in zip(eager.model.named_parameters(), captured.model.parameters()):
        torch.testing.assert_close(a, b, msg=name)
    torch.testing.assert_close(eager.sums, captured.sums)


def test_the_captured_compiled_update_trains_like_eager(corpus):
    """Inductor's loss (one compile for every shape) inside the captured update, bf16 with
    dropout: as the eager update's loss, within bf16's and dropout's noise, and finite."""
    mcfg = ModelConfig(**MODEL)
    tcfg = TrainConfig(**{**TRAIN, "precision": "bf16"})
    runs = {}
    for name, path in (("eager", {}), ("fast", {"graphs": True, "compile": True})):
        learner, sampler, stream = cuda_learner(corpus, mcfg, tcfg, static=True, **path)
        losses = LossSums(learner.sums, 0)
        for step in range(1, 4 * len(sampler) + 1):
            _, b = next(stream)
            n = float(train.n_targets(b))
            learner.step([b], n, train.rate(step, tcfg, mcfg.d_model))
            losses.add(n)
        losses.read(step)
        runs[name] = losses.take()["train/loss"]
    assert math.isfinite(runs["fast"]) and abs(runs["fast"] - runs["eager"]) < 0.1 * runs["eager"]


def test_attention_on_the_gpu_never_runs_cudnns_kernel():
    """cuDNN's attention plans each new shape (hundreds of ms); a training step and beam search
    over batches of other lengths run flash or memory-efficient attention instead."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**{**MODEL, "d_model": 64, "n_heads": 2}), 40).cuda()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for length in (5, 9):
            src = torch.randint(3, 40, (3, length), device="cuda")
            src[0, -2:] = 0  # padding: a mask
            tgt = torch.randint(3, 40, (3, length + 1), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss, _ = model.loss(src, tgt[:, :-1], tgt[:, 1:], 0.1)
            loss.backward()
            with torch.inference_mode():
                beam_search(Decoder(model.eval(), "bf16"), src, 2, 0.6, None)
            model.train()
    names = {e.key for e in prof.key_averages()}
    assert not [n for n in names if "cudnn_attention" in n]
    assert [n for n in names if "efficient_attention" in n or "flash_attention" in n]
