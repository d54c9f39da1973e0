"""Greedy and batched beam search with incremental decoding (§6.1), and the translate CLI.

    python -m transformer.decode --model data/model.pt --tokenizer data/tokenizer < in.en > out.de
    transformer-translate --model data/model.pt --tokenizer data/tokenizer -i in.en -o out.de
    transformer-translate --model a/data/model.pt --ensemble b/data/model.pt --tokenizer ...
    transformer-translate --model champion/ -i in.en      # a package (the package stage's folder)

The encoder runs once per batch; the decoder caches each layer's self-attention keys/values and
computes the cross-attention keys/values once per sentence, shared by its beams. Sentences whose
beams have all finished leave the batch. Greedy decoding is beam_size=1 on the same path.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from transformer import allocator, files, settings
from transformer.checkpoint import CheckpointError, build_model
from transformer.checkpoint import load as load_checkpoint
from transformer.files import atomic_write
from transformer.ids import BOS_ID, EOS_ID, PAD_ID
from transformer.incremental import NEG_INF, Decoder, Ensemble
from transformer.sections.decode import MAX_ALPHA, DecodeConfig
from transformer.settings import ConfigError
from transformer.vocab import TokenizerError, load_tokenizer, tokenizer_sha256


class DecodeError(ValueError):
    """A problem with decoding inputs (model file, tokenizer, input line), naming it."""


def length_penalty(length: int | Tensor, alpha: float):
    """GNMT (Wu et al. 2016) lp(Y) = ((5 + |Y|) / 6)^α; a hypothesis scores log P(Y|X) / lp(Y)."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.inference_mode()
def beam_search(
    dec: Decoder | Ensemble,
    src: Tensor,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len: Tensor | None = None,
    min_len: int = 0,
    use_cache: bool = True,
) -> list[list[int]]:
    """Best hypothesis per source row of `src` (B, S), as token ids without BOS/EOS.

    `max_len` (B,) caps each output (default S + 50, §6.1); a hypothesis reaching it ends there.
    `min_len` blocks EOS before that many tokens. `use_cache=False` recomputes the whole prefix
    at every step (the reference the cache is tested against).
    """
    B, k = src.size(0), beam_size
    if max_len is None:
        max_len = src.ne(PAD_ID).sum(1) + 50
    max_len = max_len.clamp(max=dec.max_positions).tolist()
    memory, src_pad_mask = dec.encode(src)  # on the decoder's device; the search runs on CPU
    if use_cache:
        state = dec.start(memory, src_pad_mask, k, steps=max(max_len, default=0))
    else:  # beams of a sentence are adjacent rows
        if isinstance(dec, Ensemble):
            raise ValueError("beam_search(use_cache=False) takes a single Decoder, not an Ensemble")
        memory = memory.repeat_interleave(k, dim=0)  # (B*k, S, D)
        src_pad_mask = src_pad_mask.repeat_interleave(k, dim=0)  # (B*k, S)
    rows = list(range(B))  # the original sentence of each active row
    tokens = torch.full((B * k, 1), BOS_ID, dtype=torch.long)  # (N*k, t+1)
    scores = torch.full((B, k), NEG_INF)
    scores[:, 0] = 0.0  # all beams start identical: only the first one is live at step 0
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    for t in range(max(max_len, default=0)):
        if use_cache:
            logits = dec.step(tokens[:, -1:], state)
        else:
            logits = dec.step_full(tokens, memory, src_pad_mask)
        # (N, 2k) each, brought to the CPU once a step (on a CPU: no copies)
        top, beam, tok = (
            x.cpu() for x in candidates(logits, scores.to(logits.device), block_eos=t < min_len)
        )
        N = len(rows)
        eos = tok.eq(EOS_ID) & top.isfinite()
        for n, j in eos[:, :k].nonzero().tolist():  # EOS among the k best: a finished hypothesis
            hyp = tokens[n * k + beam[n, j], 1:].tolist()
            finished[rows[n]].append((top[n, j].item() / length_penalty(t + 1, alpha), hyp))
        top, order = top.masked_fill(eos, NEG_INF).topk(k, dim=1)  # (N, k) best continuations
        beam, tok = beam.gather(1, order), tok.gather(1, order)
        origin = (torch.arange(N)[:, None] * k + beam).view(-1)  # (N*k,) row each beam comes from
        tokens = torch.cat([tokens[origin], tok.view(-1, 1)], dim=1)  # (N*k, t+2)
        scores = top
        done = []
        for n, r in enumerate(rows):
            if t + 1 >= max_len[r]:  # out of length: the live beams end here, without EOS
                lp = length_penalty(t + 1, alpha)
                finished[r] += [
                    (scores[n, j].item() / lp, tokens[n * k + j, 1:].tolist())
                    for j in range(k)
                    if scores[n, j].isfinite()
                ]
            done.append(len(finished[r]) >= k or t + 1 >= max_len[r])
        if all(done):
            break
        keep = torch.tensor([not d for d in done])
        if keep.all():
            keep = None
        else:  # drop finished sentences: later steps cost only the live ones
            rows = [r for r, d in zip(rows, done) if not d]
            scores = scores[keep]
            beam_keep = keep.repeat_interleave(k)  # (N*k,)
            tokens, origin = tokens[beam_keep], origin[beam_keep]
        if use_cache:
            dec.reorder(state, origin, keep)
        else:
            rows_on = origin.to(memory.device)
            memory, src_pad_mask = memory[rows_on], src_pad_mask[rows_on]
    return [max(f, key=lambda x: x[0])[1] if f else [] for f in finished]


def candidates(logits: Tensor, scores: Tensor, block_eos: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The 2k best extensions per sentence: (score, beam, token), each (N, 2k), best first.

    2k so that k remain to continue even if k of them end in EOS (fairseq). A sentence's best 2k
    lie among each of its beams' own best 2k, so no (N*k, V) sum of scores and log-probabilities
    is ever formed: one softmax (for the normalizer) and one blocked top-k pass over the logits.
    """
    N, k = scores.shape
    # log P = logits - lse. softmax's vectorized kernel is ~4x faster on CPU than logsumexp, and
    # its largest entry, exp(0) / sum, is >= 1/V, so the log cannot underflow.
    lse = logits.amax(-1, keepdim=True) - torch.softmax(logits, -1).amax(-1, keepdim=True).log()
    logits[:, PAD_ID] = logits[:, BOS_ID] = NEG_INF
    if block_eos:
        logits[:, EOS_ID] = NEG_INF
    c = min(2 * k, logits.size(1))
    tok_l, tok_i = topk_rows(logits, c)  # (N*k, c)
    cand = (scores.view(-1, 1) + (tok_l - lse)).view(N, k * c)  # (N, k*c)
    top, idx = cand.topk(c, dim=1)  # (N, 2k)
    return top, idx // c, tok_i.view(N, k * c).gather(1, idx)


def topk_rows(x: Tensor, c: int, block: int = 64) -> tuple[Tensor, Tensor]:
    """torch.topk(x, c, dim=1) for wide rows x (R, V), ~3x faster on CPU: the c largest entries
    of a row lie in its c blocks with the largest maxima, so one vectorized max pass over the
    blocks narrows the top-k pass down to c * block entries per row."""
    R, V = x.shape
    nb = V // block
    if nb <= 2 * c:
        return x.topk(c, dim=1)
    best = x[:, : nb * block].view(R, nb, block).amax(-1).topk(c, dim=1)[1]  # (R, c) blocks
    arange = partial(torch.arange, device=x.device)
    cols = (best[:, :, None] * block + arange(block)).view(R, c * block)  # (R, c*block)
    if V > nb * block:  # the short last block is always searched
        cols = torch.cat([cols, arange(nb * block, V).expand(R, -1)], dim=1)
    vals, j = x.gather(1, cols).topk(c, dim=1)  # (R, c)
    return vals, cols.gather(1, j)


def batches(lengths: list[int], batch_tokens: int) -> Iterator[list[int]]:
    """Indices sorted by length, cut into batches of at most batch_tokens source tokens (padded)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) + 1) * lengths[i] > batch_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def translate_ids(
    dec: Decoder | Ensemble,
    srcs: list[list[int]],
    cfg: DecodeConfig,
    min_len: int = 0,
    max_len: int | None = None,
    progress: bool = False,
) -> list[list[int]]:
    """Decode id lists (each ending in EOS) in length-sorted batches; results in input order.

    An empty source gives an empty output without touching the model.
    """
    out: list[list[int]] = [[] for _ in srcs]
    todo = [i for i, s in enumerate(srcs) if len(s) > 1 or (s and s[0] != EOS_ID)]
    bar = tqdm(total=len(srcs), unit="sent", disable=not progress, file=sys.stderr)
    bar.update(len(srcs) - len(todo))
    for b in batches([len(srcs[i]) for i in todo], cfg.batch_tokens):
        ids = [todo[j] for j in b]
        S = max(len(srcs[i]) for i in ids)
        src = torch.full((len(ids), S), PAD_ID, dtype=torch.long)  # (B, S)
        for row, i in enumerate(ids):
            src[row, : len(srcs[i])] = torch.tensor(srcs[i])
        lens = src.ne(PAD_ID).sum(1)
        if max_len is None:  # §6.1: input length + 50
            cap = (lens * cfg.max_len_a).long() + cfg.max_len_b
        else:
            cap = torch.full_like(lens, max_len)
        hyps = beam_search(dec, src, cfg.beam_size, cfg.length_penalty, cap, min_len)
        for i, h in zip(ids, hyps):
            out[i] = h
        bar.update(len(ids))
    bar.close()
    return out


# ----------------------------------------------------------------------------- the text side
@dataclass
class Translator:
    """A checkpoint (or an ensemble) plus its tokenizer: text lines in, text lines out."""

    dec: Decoder | Ensemble
    tokenizer: object  # tokenizers.Tokenizer
    cfg: DecodeConfig
    max_src: int  # source tokens (EOS included) the model can take

    def encode(self, lines: list[str], on_long: str = "truncate") -> list[list[int]]:
        """Ids (EOS appended) per line; an over-long line is truncated or rejected by number."""
        out = []
        encoded = self.tokenizer.encode_batch_fast([line.strip() for line in lines])
        for n, (line, enc) in enumerate(zip(lines, encoded), 1):
            if not line.strip():  # empty line in, empty line out
                out.append([])
                continue
            ids = enc.ids
            if len(ids) + 1 > self.max_src:
                msg = f"line {n}: {len(ids) + 1} tokens, more than the model's {self.max_src}"
                if on_long == "error":
                    raise DecodeError(msg)
                print(f"warning: {msg}; truncated", file=sys.stderr)
                ids = ids[: self.max_src - 1]
            out.append(ids + [EOS_ID])
        return out

    def translate(
        self, lines: list[str], progress: bool = False, on_long: str = "truncate"
    ) -> list[str]:
        """Translate lines; an empty line gives an empty line."""
        units = self.tokenizer.get_vocab_size()
        if self.cfg.beam_size > units:  # top-k of more than the vocabulary: no such beams
            raise DecodeError(
                f"beam size {self.cfg.beam_size} is more than the vocabulary's "
                f"{units} units (--beam-size / decode.beam_size)"
            )
        hyps = translate_ids(self.dec, self.encode(lines, on_long), self.cfg, progress=progress)
        return [self.tokenizer.decode(h, skip_special_tokens=True) if h else "" for h in hyps]


def pick_device(name: str = "auto") -> torch.device:
    """--device: auto is the (current) CUDA GPU when torch sees one, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    elif name == "cuda" and not torch.cuda.is_available():
        raise DecodeError("--device cuda: torch sees no CUDA device (a CPU build of torch?)")
    return torch.device(name)


def load_translator(
    model_path: Path,
    tokenizer_dir: Path,
    cfg: DecodeConfig,
    precision: str = "fp32",
    ensemble: Sequence[Path] = (),
    device: torch.device | None = None,
) -> Translator:
    """The model from its checkpoint, with the tokenizer checked to be the one it trained with;
    with `ensemble`, those checkpoints too, decoding together with it (incremental.Ensemble).
    `device`: default pick_device("auto")."""
    tok = load_tokenizer(tokenizer_dir)
    device = device or pick_device()
    # one at a time: a Decoder is a copy, so only one member's loaded model is alive at once
    decs = [
        Decoder(_load_model(p, tokenizer_dir, tok), precision, device)
        for p in [model_path, *ensemble]
    ]
    dec = decs[0] if len(decs) == 1 else Ensemble(decs)
    return Translator(dec, tok, cfg, dec.max_positions)


def _load_model(model_path: Path, tokenizer_dir: Path, tok) -> torch.nn.Module:
    ckpt = load_checkpoint(model_path, mmap=True)  # a training checkpoint's Adam state: unread
    model = build_model(ckpt, model_path)
    want, got = ckpt.get("tokenizer_sha256"), tokenizer_sha256(tokenizer_dir)
    if want and want != got:
        raise DecodeError(
            f"{tokenizer_dir}: tokenizer sha256 {got[:12]} is not the one "
            f"{model_path} was trained with ({want[:12]})"
        )
    if tok.get_vocab_size() != model.vocab_size:
        raise DecodeError(
            f"{tokenizer_dir}: vocabulary of {tok.get_vocab_size()} tokens, "
            f"{model_path} has {model.vocab_size}"
        )
    return model


def read_lines(path: Path | None) -> list[str]:
    """files.read_lines, from stdin when `path` is None; a DecodeError names the line."""
    return files.read_lines(path, DecodeError)


def write_lines(path: Path | None, lines: list[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    if path is None:
        sys.stdout.write(text)
    else:
        with atomic_write(Path(path), "w", encoding="utf-8") as f:
            f.write(text)


def add_decode_args(parser: argparse.ArgumentParser, multi: bool = False) -> None:
    """The decoding flags shared by the translate and evaluate CLIs: more checkpoints to
    ensemble, and the params.yaml `decode` overrides."""
    parser.add_argument(
        "--ensemble",
        type=Path,
        nargs="+",
        default=[],
        metavar="CHECKPOINT",
        help="more checkpoints (same tokenizer) to decode together with the model: each step "
        "takes the mean of their probabilities (e.g. a run's last checkpoints, or other seeds)",
    )
    parser.add_argument(
        "--params",
        type=Path,
        help=f"params.yaml whose sections give the defaults (default: ./{settings.PARAMS}; "
        "translate without one uses the paper's decoding settings)",
    )
    parser.add_argument(
        "--beam-size",
        type=int,
        nargs="+" if multi else None,
        help=("beam sizes, each scored" if multi else "beam size")
        + " (1 = greedy); default: params decode.beam_size",
    )
    parser.add_argument(
        "--length-penalty",
        type=float,
        help=f"GNMT alpha in [0, {MAX_ALPHA:g}]; default: params",
    )
    parser.add_argument(
        "--precision", choices=("fp32", "bf16", "int8"), help="default: params (int8: CPU only)"
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where to decode; auto: the GPU when torch sees one, else the CPU",
    )


def decode_config(args: argparse.Namespace) -> DecodeConfig:
    # no params.yaml (translating outside the project folder): the paper's defaults; a file
    # named with --params must exist
    cfg = DecodeConfig()
    if args.params is not None or settings.PARAMS.exists():
        cfg = settings.load(DecodeConfig, "decode", args.params or settings.PARAMS)
    beams = args.beam_size if isinstance(args.beam_size, list) else [args.beam_size]
    if any(k is not None and k < 1 for k in beams):  # the flag named, not the params key
        raise ConfigError(f"--beam-size must be >= 1, got {min(beams)}")
    if args.length_penalty is not None and not 0 <= args.length_penalty <= MAX_ALPHA:
        raise ConfigError(
            f"--length-penalty must be in [0, {MAX_ALPHA:g}], got {args.length_penalty}"
        )
    over = {
        "beam_size": beams[0],
        "length_penalty": args.length_penalty,
        "precision": args.precision,
    }
    return replace(cfg, **{k: v for k, v in over.items() if v is not None})


def unpack(args: argparse.Namespace) -> None:
    """--model DIR, a package: its model.pt, and its tokenizer/ and params.yaml where the
    command line names none."""
    if args.model.is_dir():
        pkg = args.model
        if not (pkg / "model.pt").is_file():
            raise DecodeError(
                f"{pkg}: a folder without model.pt: not a package (--model takes a "
                "checkpoint file or a package folder)"
            )
        args.model = pkg / "model.pt"
        args.tokenizer = args.tokenizer or pkg / "tokenizer"
        if args.params is None and (pkg / settings.PARAMS.name).is_file():
            args.params = pkg / settings.PARAMS.name
    if args.tokenizer is None:
        raise DecodeError("--tokenizer is required unless --model is a package folder")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="transformer-translate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        type=Path,
        required=True,
        help="checkpoint (trained or averaged), or a package folder (model.pt, tokenizer/, "
        "params.yaml: what `dvc artifacts get` fetches), whose tokenizer and decoding settings "
        "are then the defaults",
    )
    parser.add_argument(
        "--tokenizer", type=Path, help="tokenizer directory (required unless --model is a package)"
    )
    parser.add_argument(
        "-i", "--input", type=Path, help="source text, one sentence a line; default stdin"
    )
    parser.add_argument("-o", "--output", type=Path, help="translations; default stdout")
    parser.add_argument(
        "--on-long",
        choices=("truncate", "error"),
        default="truncate",
        help="a line longer than the model's max_positions: truncate (with a warning) or fail",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_decode_args(parser)
    args = parser.parse_args(argv)
    allocator.keep_freed_memory()  # see there: 2x decoding speed on glibc
    try:
        unpack(args)
        cfg = decode_config(args)
        tr = load_translator(
            args.model, args.tokenizer, cfg, cfg.precision, args.ensemble, pick_device(args.device)
        )
        lines = read_lines(args.input)
        write_lines(args.output, tr.translate(lines, not args.no_progress, args.on_long))
    except (DecodeError, CheckpointError, ConfigError, TokenizerError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
