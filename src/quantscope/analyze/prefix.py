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
after                (:func:`scan_after`) the same peaks on the prefixed graph: the
                     calibration windows that still have an outlier position (its token,
                     its position), and which of the ``PROBE_TOKENS`` most frequent
                     calibration tokens are outliers as the first token after the prefix
                     (each run alone after it, its peak over the calibration's median
                     position per tensor). On smollm2-135m a delimiter (``\n``, ``.``,
                     ``:``, `` (`` …) right after ``<|endoftext|>`` becomes a second sink
                     (~330x): one calibration window that begins with one sizes every
                     residual grid for it (docs/benchmarks.md, "What limits decode, and
                     what is left after the prefix"); said in the plan, the verdict, the
                     host steps and the report
===================  ==================================================================
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from quantscope.analyze.phases import residual_groups
from quantscope.calibrate.collect import tapped_model
from quantscope.emulate.release import release_memory
from quantscope.emulate.session import make_session
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.tasks.lm_phases import OpenPhase, runner
from quantscope.types import Plan, QuantscopeError
from quantscope.zoo.prefix import KVPrefix, infer_light, prefixed_prefill

THRESHOLD = 64.0
MAX_TOKENS = 4
PROBE_TOKENS = 200
PREFIX_CHOICES = ("auto", "none")
HEAD = "head:"  # a prefix mode: the document token, then a prompt head's tokens
HEAD_MAX_TOKENS = 256
HEAD_WHY = ("the prompt head (--prompt-head): every prompt of the deployment begins with it, "
            "so it is in the cache and the prompt starts after it")


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

    def profile(self) -> tuple[float, ...]:
        """Per position of a window: its largest peak over the median position, over the
        windows (what the report plots)."""
        return position_profile(self.ratios)


def position_profile(ratios: Sequence[np.ndarray]) -> tuple[float, ...]:
    """Per position, the largest of the windows' ratios there (windows of any lengths)."""
    if not ratios:
        return ()
    table = np.full((len(ratios), max(len(r) for r in ratios)), np.nan)
    for i, r in enumerate(ratios):
        table[i, :len(r)] = r
    return tuple(float(x) for x in np.nanmax(table, axis=0))


def scan_sinks(prefill: Model, windows: Sequence[np.ndarray]) -> SinkScan:
    """FP32 residual peaks per position of each window (one tapped session)."""
    names = [g.outputs[0] for g in residual_groups(find_groups(prefill))]
    if not names:
        raise QuantscopeError("no residual stream found (Adds read by a normalisation): "
                              "a KV prefix needs a decoder whose norms are RMSNormalization "
                              "or LayerNormalization nodes (--prefix none runs without one)")
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
    profile: tuple[float, ...] = ()  # per position, the largest ratio over the windows, before


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
    return PrefixChoice(tuple(tokens), tuple(why), scan.first_ratio(), scan.worst_later(),
                        scan.profile())


def with_head(prefix: str, head: str | None) -> str:
    """``--prefix`` with ``--prompt-head`` folded in (``head:TEXT``): the text every prompt
    of the deployment begins with (a chat template's system part) goes into the constant
    KV prefix after the document token, in FP32, and the figures judge what follows it
    (FP32 reads it too: unlike tokens added to every prompt by quantscope, a head the
    application sends anyway changes nothing the user gets; docs/benchmarks.md, "A longer
    KV prefix that leaves no sink"). Refused in one line with ``--prefix none`` or an empty
    text."""
    if head is None:
        return prefix
    if prefix == "none":
        raise QuantscopeError("--prompt-head puts the head into the KV prefix: drop "
                              "--prefix none (or the head)")
    if not head.strip():
        raise QuantscopeError("--prompt-head is empty: give the text every prompt begins "
                              "with (e.g. the chat template's system part), or leave it out")
    return HEAD + head


def head_choice(first: int | None, ids: Sequence[int], scan: SinkScan | None = None
                ) -> PrefixChoice:
    """The prefix of a prompt head: the document token ``first`` (where the tokenizer has
    one), then the head's token ids; refused over ``HEAD_MAX_TOKENS``. ``scan``: the
    calibration windows' peaks without a prefix, recorded as the "before" figures."""
    if not ids:
        raise QuantscopeError("--prompt-head gives no token: give the text every prompt "
                              "begins with")
    if len(ids) > HEAD_MAX_TOKENS:
        raise QuantscopeError(f"--prompt-head is {len(ids)} tokens long: give at most "
                              f"{HEAD_MAX_TOKENS} (the cache holds it before every prompt)")
    lead = [] if first is None else [int(first)]
    why = ["first position (the tokenizer's document token)"] * len(lead)
    before = (math.nan, math.nan, ()) if scan is None else (
        scan.first_ratio(), scan.worst_later(), scan.profile())
    return PrefixChoice(tuple(lead + [int(t) for t in ids]),
                        tuple(why + [HEAD_WHY] * len(ids)), *before)


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


@dataclass(frozen=True)
class AfterPrefix:
    """What is left after the prefix (see the module docstring)."""

    windows: int  # calibration windows scanned on the prefixed graph
    over: int  # of them, those with a position over the threshold
    worst_ratio: float  # the largest position's peak over its window's median position
    worst_token: int
    worst_position: int  # in its window (0: the first token after the prefix)
    probed: int  # most frequent calibration tokens tried as the first token after it
    first_sinks: tuple[tuple[int, float], ...]  # (token, ratio) over the threshold, worst first
    profile: tuple[float, ...] = ()  # per position after the prefix, the largest ratio


def _peaks(session: Any, names: list[str], ids: np.ndarray) -> np.ndarray:
    """Per residual tensor and position: the max |x| over channels ([tensors, N])."""
    return np.stack([np.abs(v[0]).max(-1) for v in session.run(names, {"input_ids": ids[None]})])


def scan_after(prefixed: Model, windows: Sequence[np.ndarray], *,
               threshold: float = THRESHOLD, probe: int = PROBE_TOKENS) -> AfterPrefix:
    """Residual peaks on the prefixed prefill graph (one tapped session; see the module
    docstring): the calibration windows, then each probed token alone after the prefix."""
    names = [g.outputs[0] for g in residual_groups(find_groups(prefixed))]
    session = make_session(tapped_model(prefixed, names), optimize=True, arena=False)
    per = [_peaks(session, names, ids) for ids in windows]
    ratios = [(p / np.maximum(np.median(p, axis=1, keepdims=True), 1e-30)).max(0) for p in per]
    w = int(np.argmax([r.max() for r in ratios]))
    pos = int(ratios[w].argmax())
    median = np.maximum(np.median(np.concatenate(per, axis=1), axis=1), 1e-30)
    counts = Counter(int(t) for ids in windows for t in ids)
    sinks = []
    for tok, _ in counts.most_common(probe):
        r = float((_peaks(session, names, np.array([tok], np.int64))[:, 0] / median).max())
        if r > threshold:
            sinks.append((tok, r))
    del session
    release_memory()
    return AfterPrefix(len(per), sum(int(r.max() > threshold) for r in ratios),
                       float(ratios[w][pos]), int(windows[w][pos]), pos,
                       min(probe, len(counts)), tuple(sorted(sinks, key=lambda s: -s[1])),
                       position_profile(ratios))


def format_prefix(prefix: dict[str, Any] | None) -> str:
    """One line: the KV prefix the figures ran with (or that there was none), and what is
    left after it when that was scanned (a plan's record, ``meta['kv_prefix']``)."""
    if not prefix:
        return "KV prefix: none (the prompt's first token runs through the quantized graphs)"
    toks = prefix_words(prefix)
    ratio = prefix["first_position_ratio"]
    seen = "" if math.isnan(ratio) else (
        f"; before it, position 0 peaked at {ratio:.3g}x the median position, the largest "
        f"later position at {prefix['largest_later_ratio']:.3g}x (outlier: > "
        f"{prefix['threshold']:g}x)")
    after = after_text(prefix)
    return (f"KV prefix: {len(prefix['tokens'])} token(s) in FP32 in the cache: {toks}{seen}"
            + (f"; {after}" if after else ""))


def prefix_words(prefix: dict[str, Any]) -> str:
    """The prefix's tokens as text, each run of tokens with one reason (a prompt head) as
    one string with its reason once: ``'<|endoftext|>' (first position …), 'You are a
    helpful assistant.\\n' (the prompt head …)``. The text is the tokenizer's decoding
    (``decoded``; a record from before it has the vocabulary's spelling, ``text``:
    ``'Ġthe'``, ``'Ċ'``)."""
    words = prefix.get("decoded") or prefix["text"]
    runs: list[tuple[str, str]] = []
    for x, why in zip(words, prefix["why"], strict=True):
        if runs and runs[-1][1] == why:
            runs[-1] = (runs[-1][0] + x, why)
        else:
            runs.append((x, why))
    return ", ".join(f"{x!r} ({why})" for x, why in runs)


def after_text(prefix: dict[str, Any]) -> str:
    """What is left after the prefix, in words ('' when it was not scanned)."""
    a = prefix.get("after")
    if not a:
        return ""
    where = ("the window's first token" if a["worst_position"] == 0
             else f"position {a['worst_position']} of its window")
    left = (f"after it, {a['over']} of {a['windows']} calibration window(s) still have an "
            f"outlier position (largest {a['worst_ratio']:.3g}x: {a['worst_text']!r} at "
            f"{where}), which sizes the residual grids" if a["over"] else
            f"after it, no calibration window has an outlier position (largest "
            f"{a['worst_ratio']:.3g}x)")
    sinks = ", ".join(repr(t) for _, t, _ in a["first_sinks"])
    return left + (f"; as the first token after it, {len(a['first_sinks'])} of the "
                   f"{a['probed']} most frequent tokens are outliers: {sinks}" if sinks else "")


def recorded_prefix(plan: Plan) -> tuple[int, ...]:
    """The prefix tokens a plan records (``meta['kv_prefix']``), () if none."""
    text = dict(plan.meta).get("kv_prefix")
    return tuple(int(t) for t in json.loads(text)["tokens"]) if text else ()


def prefixed_opener(open_phase: OpenPhase, prefix: KVPrefix | None) -> OpenPhase:
    """``open_phase`` with its prefill graph reading ``prefix`` (None: unchanged);
    ``open_phase`` must return a fresh graph on each call (it is edited in place)."""
    if prefix is None:
        return open_phase

    def opened(phase: str) -> Model:
        model = open_phase(phase)  # a fresh graph each time: edited in place
        return prefixed_model(model, prefix, in_place=True) if phase == "prefill" else model

    return opened


__all__ = ["HEAD", "HEAD_MAX_TOKENS", "HEAD_WHY", "MAX_TOKENS", "PREFIX_CHOICES", "head_choice",
           "with_head", "PROBE_TOKENS", "THRESHOLD", "AfterPrefix",
           "PrefixChoice", "SinkScan", "after_text", "choose_prefix", "compute_prefix",
           "format_prefix", "position_profile", "prefix_words", "recorded_prefix", "prefixed_model", "prefixed_opener",
           "scan_after", "scan_sinks"]
