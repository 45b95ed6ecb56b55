"""Which tokens go into a decoder's constant KV prefix, and their FP32 keys and values.

===================  ==================================================================
residual peak        FP32 prefill on the calibration windows, per residual tensor
                     (:func:`~quantscope.analyze.phases.residual_groups`) and position:
                     the max |x| over channels, over that window's median position
outlier token        a position whose peak, in any residual tensor, exceeds
                     ``THRESHOLD`` (64, PrefixQuant's) times the median position: a
                     static symmetric 8-bit grid wide enough for it leaves the median
                     token about 2 steps (255 / 2 / 64)
the prefix           the first position's token (``first``: the tokenizer's document
                     token, e.g. ``<|endoftext|>``, where it has one, else the most
                     frequent outlier token, else the most frequent token), then the
                     token ids that are outliers at positions > 0 at least twice, most
                     often first, up to ``max_tokens`` in all
keys / values        the FP32 prefill graph's ``present.*`` on the prefix tokens
after                the same peaks measured on the prefixed graph: what is left
===================  ==================================================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from quantscope.analyze.phases import residual_groups
from quantscope.calibrate.collect import tapped_model
from quantscope.emulate.session import make_session
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.tasks.lm_phases import OpenPhase, release_memory, runner
from quantscope.types import QuantscopeError
from quantscope.zoo.prefix import KVPrefix, infer_light, prefixed_prefill

THRESHOLD = 64.0
MAX_TOKENS = 4
PREFIX_CHOICES = ("auto", "none")


@dataclass(frozen=True)
class SinkScan:
    """Residual peaks of the calibration windows (see the module docstring)."""

    ratios: tuple[np.ndarray, ...]  # per window [positions]: max over tensors of peak/median
    windows: tuple[np.ndarray, ...]  # the token ids

    def outliers(self, threshold: float = THRESHOLD) -> Counter[int]:
        """Token id -> how often it is an outlier at a position > 0."""
        out: Counter[int] = Counter()
        for r, ids in zip(self.ratios, self.windows, strict=True):
            out.update(int(ids[p]) for p in np.nonzero(r > threshold)[0] if p > 0)
        return out

    def first_ratio(self) -> float:
        """The first position's peak over the median position (median over the windows)."""
        return float(np.median([r[0] for r in self.ratios])) if self.ratios else 0.0

    def worst_later(self) -> float:
        """The largest peak over the median position at positions > 0."""
        return max((float(r[1:].max()) for r in self.ratios if len(r) > 1), default=0.0)


def scan_sinks(prefill: Model, windows: Sequence[np.ndarray]) -> SinkScan:
    """FP32 residual peaks per position of each window (one tapped session)."""
    names = [g.outputs[0] for g in residual_groups(find_groups(prefill))]
    if not names:
        raise QuantscopeError("no residual stream found (Adds read by a normalisation): "
                              "a KV prefix needs a decoder")
    session = make_session(tapped_model(prefill, names), optimize=True, arena=False)
    ratios = []
    for ids in windows:
        peaks = np.stack([np.abs(v[0]).max(-1) for v in
                          session.run(names, {"input_ids": ids[None]})])  # [tensors, N]
        med = np.maximum(np.median(peaks, axis=1, keepdims=True), 1e-30)
        ratios.append((peaks / med).max(0))
    del session
    release_memory()
    return SinkScan(tuple(ratios), tuple(windows))


@dataclass(frozen=True)
class PrefixChoice:
    tokens: tuple[int, ...]
    why: tuple[str, ...]  # per token
    first_ratio: float  # the first position's peak / median, before
    later_ratio: float  # the largest later position's, before


def choose_prefix(scan: SinkScan, first: int | None, *, max_tokens: int = MAX_TOKENS,
                  threshold: float = THRESHOLD) -> PrefixChoice:
    """The prefix tokens of the module docstring, each with why it is there."""
    counts = scan.outliers(threshold)
    if first is not None:
        why_first = "first position (the tokenizer's document token)"
    elif counts:
        first = counts.most_common(1)[0][0]
        why_first = "first position (the most frequent outlier token)"
    else:
        first = Counter(int(t) for w in scan.windows for t in w).most_common(1)[0][0]
        why_first = "first position (the most frequent token)"
    tokens, why = [first], [why_first]
    for tok, n in counts.most_common():
        if len(tokens) >= max_tokens or n < 2:
            break
        if tok not in tokens:
            tokens.append(tok)
            why.append(f"outlier (> {threshold:g}x the median position) {n} times")
    return PrefixChoice(tuple(tokens), tuple(why), scan.first_ratio(), scan.worst_later())


def compute_prefix(prefill: Model, tokens: Sequence[int]) -> KVPrefix:
    """The FP32 prefill's keys and values of ``tokens`` (its ``present.*``)."""
    out = runner(prefill)({"input_ids": np.array([list(tokens)], np.int64)})
    layers = sum(1 for k in out if k.startswith("present.") and k.endswith(".key"))
    return KVPrefix(tuple(int(t) for t in tokens),
                    tuple(out[f"present.{i}.key"] for i in range(layers)),
                    tuple(out[f"present.{i}.value"] for i in range(layers)))


def prefixed_model(prefill: Model, prefix: KVPrefix, *, in_place: bool = False) -> Model:
    """The prefill graph reading ``prefix``, shapes inferred again (``in_place``: edits
    ``prefill``'s graph, no second copy of the weights); its ``source`` names the file
    and the prefix, so runners build from the graph itself, not from the file."""
    proto = infer_light(prefixed_prefill(prefill.proto, prefix, in_place=in_place))
    model = Model(proto=proto, source=f"{prefill.source} + KV prefix {list(prefix.tokens)}")
    release_memory()
    return model


def prefixed_opener(open_phase: OpenPhase, prefix: KVPrefix | None) -> OpenPhase:
    """``open_phase`` with its prefill graph reading ``prefix`` (None: unchanged);
    ``open_phase`` must return a fresh graph on each call (it is edited in place)."""
    if prefix is None:
        return open_phase

    def opened(phase: str) -> Model:
        model = open_phase(phase)  # a fresh graph each time: edited in place
        return prefixed_model(model, prefix, in_place=True) if phase == "prefill" else model

    return opened


__all__ = ["MAX_TOKENS", "PREFIX_CHOICES", "THRESHOLD", "PrefixChoice", "SinkScan",
           "choose_prefix", "compute_prefix", "prefixed_model", "prefixed_opener",
           "scan_sinks"]
