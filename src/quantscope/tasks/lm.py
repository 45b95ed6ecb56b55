"""Next-token prediction: token windows from frozen text, and streaming LM metrics.

==================  ====================================================================
text                ``stdlib-docs``: calibration windows are the 512 calibration texts
                    joined by newlines and cut into ``seq_len``-token windows; evaluation
                    windows are the retrieval *documents* (disjoint from the calibration
                    texts) with at least ``seq_len`` tokens, cut to ``seq_len``
tokenizer           a ``tokenizers`` JSON next to the prefill graph (``.prefill.`` ->
                    ``.tokenizer.``, ``.onnx`` -> ``.json``), no BOS token added
top-1 agreement     fraction of positions where the emulated argmax is FP32's
KL                  mean over positions of KL(FP32 || emulated) of the next-token
                    distribution, in nats
perplexity ratio    exp(mean NLL of the true next token, emulated) /
                    exp(mean NLL, FP32); 1.0 = no loss
greedy agreement    per prompt, the fraction of the generated tokens before the first
                    token where emulated greedy decoding leaves FP32's (mean over prompts)
standard error      ``*_se``: over the blocks folded in (a window, a prompt), each a
                    cluster: for a mean of sums m = sum a_i / sum n_i,
                    se = sqrt(k / (k - 1) * sum (a_i - m n_i)^2) / sum n_i; the
                    perplexity ratio's is exp(m) * se of the mean NLL difference
memory              :class:`NextToken` folds a [positions, vocab] block into five sums
                    (and four numbers per block) and keeps nothing else:
                    full-vocabulary logits live for one run only
==================  ====================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tokenizers

from quantscope.tasks.text import STDLIB_DOCS, load_calibration_texts, load_pairs
from quantscope.types import QuantscopeError

DEFAULT_SEQ_LEN = 64


def tokenizer_path(prefill: str | Path) -> Path:
    """The tokenizer JSON that sits next to a ``*.prefill.*.onnx`` graph."""
    prefill = Path(prefill)
    path = prefill.with_name(prefill.name.replace(".prefill.", ".tokenizer.")).with_suffix(".json")
    if ".prefill." not in prefill.name or not path.is_file():
        raise QuantscopeError(f"no tokenizer next to '{prefill}': expected '{path}'")
    return path


def load_lm_tokenizer(prefill: str | Path) -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(tokenizer_path(prefill)))


@dataclass(frozen=True)
class TokenWindows:
    """Token id windows [seq_len] for calibration and evaluation, and where they came from."""

    calibration: tuple[np.ndarray, ...]
    evaluation: tuple[np.ndarray, ...]
    source: str


def token_windows(tok: tokenizers.Tokenizer, *, seq_len: int = DEFAULT_SEQ_LEN,
                  calibration: int = 16, evaluation: int = 8, name: str = STDLIB_DOCS
                  ) -> TokenWindows:
    """``calibration`` / ``evaluation`` windows of ``seq_len`` tokens (see module docstring)."""
    joined = tok.encode("\n".join(load_calibration_texts(name))).ids
    cal = tuple(np.array(joined[i:i + seq_len], np.int64)
                for i in range(0, len(joined) - seq_len + 1, seq_len))[:calibration]
    ev = []
    for doc in load_pairs(name).documents:
        ids = tok.encode(doc).ids
        if len(ids) >= seq_len:
            ev.append(np.array(ids[:seq_len], np.int64))
        if len(ev) == evaluation:
            break
    if len(cal) < calibration or len(ev) < evaluation:
        raise QuantscopeError(f"'{name}' has {len(cal)} calibration and {len(ev)} evaluation "
                              f"windows of {seq_len} tokens: ask for fewer or shorter ones")
    return TokenWindows(cal, tuple(ev), f"{name} ({seq_len}-token windows)")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@dataclass
class NextToken:
    """Streaming next-token metrics of emulated logits against FP32 (five running sums)."""

    positions: int = 0
    agree: int = 0
    kl: float = 0.0
    nll_ref: float = 0.0
    nll_test: float = 0.0
    blocks: list[tuple[int, int, float, float]] = field(default_factory=list)

    def add(self, ref: np.ndarray, test: np.ndarray, targets: np.ndarray | None) -> None:
        """Fold logits [n, V] (FP32 and emulated) and the true next tokens [n] (or None)."""
        lr, lt = log_softmax(ref), log_softmax(test)
        agree = int((lr.argmax(-1) == lt.argmax(-1)).sum())
        kl = float((np.exp(lr) * (lr - lt)).sum())
        nll_ref = nll_test = 0.0
        if targets is not None:
            rows = np.arange(len(targets))
            nll_ref, nll_test = -float(lr[rows, targets].sum()), -float(lt[rows, targets].sum())
        self.positions += len(lr)
        self.agree += agree
        self.kl += kl
        self.nll_ref += nll_ref
        self.nll_test += nll_test
        self.blocks.append((len(lr), agree, kl, nll_test - nll_ref))

    def values(self) -> dict[str, float]:
        n = max(self.positions, 1)
        ratio = float(np.exp((self.nll_test - self.nll_ref) / n))
        b = np.array(self.blocks or [(0, 0, 0.0, 0.0)], np.float64)
        return {"top1_agreement": self.agree / n, "kl": self.kl / n,
                "ppl_fp32": float(np.exp(self.nll_ref / n)),
                "ppl": float(np.exp(self.nll_test / n)),
                "ppl_ratio": ratio,
                "positions": float(self.positions),
                "top1_agreement_se": cluster_se(b[:, 1], b[:, 0]),
                "kl_se": cluster_se(b[:, 2], b[:, 0]),
                "ppl_ratio_se": ratio * cluster_se(b[:, 3], b[:, 0]),
                "blocks": float(len(self.blocks))}


def cluster_se(sums: np.ndarray, counts: np.ndarray) -> float:
    """Standard error of sum(sums) / sum(counts) over k blocks (module docstring); 0 for
    fewer than two blocks."""
    k, total = len(sums), float(counts.sum())
    if k < 2 or total <= 0:
        return 0.0
    m = float(sums.sum()) / total
    return float(np.sqrt(k / (k - 1) * ((sums - m * counts) ** 2).sum()) / total)


@dataclass
class Greedy:
    """Greedy-generation agreement: matched prefix length over generated length; and, where
    :meth:`along` is given FP32's reading of each emulated continuation, how FP32 finds
    those tokens: the share of them it picks itself after the same tokens
    (``greedy_stepwise``: one divergence ends the matched prefix, not this), and their
    perplexity under FP32 over that of FP32's own greedy tokens (``greedy_ppl_ratio``)."""

    matched: list[float] = field(default_factory=list)
    # per prompt: (tokens, FP32 picks the same, FP32 NLL of the emulated tokens, of its own)
    steps: list[tuple[int, int, float, float]] = field(default_factory=list)

    def along(self, hits: np.ndarray, nll_test: np.ndarray, nll_ref: np.ndarray) -> None:
        """One prompt: per emulated token, whether FP32 picks it after the same tokens, and
        its NLL under FP32; ``nll_ref``: FP32's NLL of its own greedy tokens."""
        self.steps.append((len(hits), int(np.sum(hits)), float(np.sum(nll_test)),
                           float(np.sum(nll_ref))))

    def add(self, ref: Sequence[int], test: Sequence[int]) -> None:
        same = 0
        for a, b in zip(ref, test, strict=True):
            if a != b:
                break
            same += 1
        self.matched.append(same / max(len(ref), 1))

    def values(self) -> dict[str, float]:
        m = np.array(self.matched or [0.0])
        out = {"greedy_agreement": float(m.mean()), "greedy_identical": float((m == 1).mean()),
               "prompts": float(len(self.matched)),
               "greedy_agreement_se": cluster_se(m, np.ones_like(m))}
        if self.steps:
            n, hits, test, ref = (np.array(c, np.float64) for c in zip(*self.steps, strict=True))
            ratio = float(np.exp((test.sum() - ref.sum()) / n.sum()))
            out.update(greedy_stepwise=float(hits.sum() / n.sum()),
                       greedy_stepwise_se=cluster_se(hits, n), greedy_ppl_ratio=ratio,
                       greedy_ppl_ratio_se=ratio * cluster_se(test - ref, n))
        return out


def document_token(tok: tokenizers.Tokenizer) -> int | None:
    """The tokenizer's lowest-id special token (``<|endoftext|>``), None without one."""
    ids = [i for i, t in tok.get_added_tokens_decoder().items() if t.special]
    return min(ids) if ids else None


def token_texts(tok: tokenizers.Tokenizer, tokens: Sequence[int]) -> tuple[str, ...]:
    """Each token's text ('\\n', not 'Ċ'), such that joined they spell the tokens' text: a
    character whose bytes span several tokens goes to the token that completes it (decoded
    one by one, each part would print as '\ufffd'). A token that decodes to nothing is '?'."""
    out: list[str] = []
    done = ""
    for i in range(len(tokens)):
        text = tok.decode(list(tokens[: i + 1]), skip_special_tokens=False)
        if text.endswith("\ufffd") and i + 1 < len(tokens):  # a character not finished yet
            out.append("")
            continue
        new = text[len(done):] if text.startswith(done) else text
        out.append(new or "?")
        done = text
    return tuple(out)


__all__ = ["DEFAULT_SEQ_LEN", "Greedy", "document_token", "token_texts", "NextToken", "TokenWindows", "cluster_se",
           "load_lm_tokenizer",
           "log_softmax", "token_windows", "tokenizer_path"]
