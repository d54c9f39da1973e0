"""py3langid's `classify` over many lines at once: the same model and the same answers, batched.

py3langid walks each line's UTF-8 bytes through its feature DFA one byte at a time in Python and
scores each line with its own small product; on the WMT14 rehearsal that was 54% and 34% of the
crawl filters' time (docs/experiments/2026-11-29-rehearsal-filters.md). Here all lines of a
batch step through the DFA together (one numpy gather per byte position), and the naive-Bayes
product is one fused `embedding_bag` (each line's feature rows, weighted by log1p of their
counts, summed), which reads every table row once instead of copying it. The answers are
py3langid's own up to float32 summation order (tests/test_langid.py compares them line by line).
"""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def identifier():
    """py3langid's model, loaded once per process (~0.5 s), with normalised probabilities."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


class BatchIdentifier:
    """`classify(texts)` -> [(language, probability)], as py3langid's classify line by line."""

    def __init__(self) -> None:
        import torch  # here, not at the top: only the stages that identify languages pay for it

        ident = identifier()
        self.ident, self.torch = ident, torch
        self.nextmove = np.asarray(ident.tk_nextmove, dtype=np.int64)
        self.rowbase = np.asarray(ident._rowbase, dtype=np.int64)
        self.output = np.asarray(ident.tk_output, dtype=np.int64)
        # (features, classes) in float32 once (~57 MB): py3langid's product casts its float16 rows
        self.table = torch.from_numpy(np.asarray(ident.nb_ptc, dtype=np.float32))
        self.pc = np.asarray(ident.nb_pc, dtype=np.float32)
        self.classes = ident.nb_classes
        self.aliases = ident._alias_pairs

    def features(self, data: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """(line, feature) of every feature the DFA emits, over all lines, in no fixed order."""
        lengths = np.fromiter(map(len, data), dtype=np.int64, count=len(data))
        order = np.argsort(-lengths, kind="stable")  # longest first: the active lines a prefix
        width = int(lengths.max(initial=0))
        grid = np.zeros((width, len(data)), dtype=np.uint8)  # byte t of every line: contiguous
        for row, i in enumerate(order.tolist()):
            grid[: lengths[i], row] = np.frombuffer(data[i], dtype=np.uint8)
        active = np.searchsorted(-lengths[order], -np.arange(width), side="right")
        state = np.zeros(len(data), dtype=np.int64)
        lines, feats = [], []
        for t in range(width):
            n = int(active[t])
            state[:n] = self.nextmove[self.rowbase[state[:n]] + grid[t, :n]]
            f = self.output[state[:n]]
            hit = np.flatnonzero(f >= 0)
            lines.append(order[hit])
            feats.append(f[hit])
        if not lines:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(lines), np.concatenate(feats)

    def scores(self, data: list[bytes]) -> np.ndarray:
        """(lines, classes) raw naive-Bayes scores; 0 for a line without features (py3langid's)."""
        torch = self.torch
        lines, feats = self.features(data)
        n_feat = self.table.shape[0]
        keys, counts = np.unique(lines * n_feat + feats, return_counts=True)  # sorted by line
        line_of, feat_of = np.divmod(keys, n_feat)
        starts = np.flatnonzero(np.r_[True, line_of[1:] != line_of[:-1]]) if len(keys) else keys
        out = np.zeros((len(data), len(self.classes)), dtype=np.float32)
        if len(keys):
            summed = torch.nn.functional.embedding_bag(
                torch.from_numpy(feat_of),
                self.table,
                torch.from_numpy(starts),
                mode="sum",
                per_sample_weights=torch.from_numpy(np.log1p(counts.astype(np.float32))),
            )
            out[line_of[starts]] = summed.numpy() + self.pc
        return out

    def classify(
        self, texts: list[str], budget: int = 1 << 24, lines: int = 8192
    ) -> list[tuple[str, float]]:
        """py3langid's (language, probability) of each text. Lines go through the DFA sorted by
        length, at most `lines` at once, in batches whose byte grid (lines x longest line) stays
        within `budget` bytes: a long line never makes a short one's grid row as long."""
        data = [self.ident._encode(t) for t in texts]
        lengths = np.fromiter(map(len, data), dtype=np.int64, count=len(data))
        order = np.argsort(lengths, kind="stable").tolist()
        width = lengths[order].tolist()
        out: list = [None] * len(data)
        start = 0
        for end in range(1, len(order) + 1):
            if (
                end < len(order)
                and end - start < lines
                and (end - start + 1) * width[end] <= budget
            ):
                continue
            batch = order[start:end]
            for i, answer in zip(batch, self._classify([data[i] for i in batch])):
                out[i] = answer
            start = end
        return out

    def _classify(self, data: list[bytes]) -> list[tuple[str, float]]:
        scores = self.scores(data)
        lengths = np.fromiter(map(len, data), dtype=np.float32, count=len(data))
        scores *= (1.0 / np.sqrt(np.maximum(lengths, 1)))[:, None]
        np.exp(scores - scores.max(axis=1, keepdims=True), out=scores)
        scores /= scores.sum(axis=1, keepdims=True)
        for a, b in self.aliases:  # a script's second column folded into the first (srl -> sr)
            scores[:, a] += scores[:, b]
            scores[:, b] = 0.0
        best = scores.argmax(axis=1)
        probs = scores[np.arange(len(data)), best]
        return [(self.classes[j], float(p)) for j, p in zip(best.tolist(), probs.tolist())]
