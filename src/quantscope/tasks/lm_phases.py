"""Calibrate and evaluate a decoder's two phase graphs (prefill, decode) under one plan.

===================  =================================================================
calibration          prefill: the calibration windows; decode: the last ``steps``
                     positions of each window, fed the FP32 cache of the tokens before
                     (sliced from one FP32 prefill: the cache is causal, so the slice is
                     exactly what token-by-token decoding would have built)
``prefill``          every position of each evaluation window but the last, predicting
                     the next token of the text
``decode_fp32_kv``   the last ``steps`` positions, one token at a time, each fed the
                     FP32 cache: the decode graph's own error
``decode_emu_kv``    the same steps fed the emulated cache: the emulated prefill's cache
                     for the prompt, then the emulated decode graph's own appended
                     entries (error accumulates as on the device)
reference            FP32 prefill logits at those positions (equal to FP32 decode's;
                     tested), so FP32 decode runs only for greedy generation
FP32's greedy        made once per process for the same two graphs, prompts and length
                     (:func:`fp32_greedy`): a decoder run measures against them in
                     its plan, evaluate, w4, finetune and whatif stages
greedy               ``new_tokens`` greedy tokens per prompt, FP32 and emulated, each
                     with its own prefill then decode loop; then FP32 reads each
                     emulated continuation (one prefill run over the prompt and it):
                     the share of its tokens FP32 picks itself after the same tokens,
                     and their perplexity under FP32 over that of FP32's own
                     (:class:`~quantscope.tasks.lm.Greedy`)
time                 seconds in the emulated prefill and decode runs, per plan; FP32
                     too: the reference prefill runs of that plan's scoring, and the
                     FP32 decode steps of greedy generation (measured once, same process)
memory               a phase graph is opened (``open_phase``) only while it is needed:
                     a session keeps its own copy of the weights, so at most the FP32
                     prefill session and one emulated session are alive, and none
                     while an emulated one is built (its transient copies are the
                     peak): a plan's prefill runs first (keeping per window only the
                     caches and the ``steps`` FP32 logit rows decode needs), then its
                     decode runs
===================  =================================================================
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from quantscope.calibrate.collect import calibrate, tapped_model
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.emulate.release import release_memory
from quantscope.emulate.session import make_session
from quantscope.kept import Kept
from quantscope.model.groups import find_groups
from quantscope.model.load import Model, model_digest
from quantscope.model.phases import PAST_PREFIX
from quantscope.tasks.lm import Greedy, NextToken, TokenWindows, log_softmax
from quantscope.types import Plan, Stats
from quantscope.zoo.decoder import PRODUCER

Run = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
OpenPhase = Callable[[str], Model]  # "prefill" | "decode" -> the loaded graph
LM_PHASES = ("prefill", "decode_fp32_kv", "decode_emu_kv")


def runner(model: Model | onnx.ModelProto) -> Run:
    """An ORT session (the one factory) as ``feeds -> {output name: array}``.

    A built-in decoder graph is opened from its file (it is the file's graph unchanged,
    weights as external data), so the session holds its weights once."""
    proto = model.proto if isinstance(model, Model) else model
    source = Path(model.source) if isinstance(model, Model) else None
    built_in = proto.producer_name == PRODUCER and source is not None and source.is_file()
    session = make_session(source if built_in else proto)  # type: ignore[arg-type]
    names = [o.name for o in session.get_outputs()]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(None, feeds), strict=True))

    return run


def cache_of(out: dict[str, np.ndarray], upto: int | None = None) -> dict[str, np.ndarray]:
    """``present.*`` outputs (first ``upto`` positions) as the next run's ``past.*`` feeds."""
    return {PAST_PREFIX + k[len("present."):]: v[:, :, :upto] for k, v in out.items()
            if k.startswith("present.")}


def prefix_length(out: dict[str, np.ndarray], ids: np.ndarray) -> int:
    """Cache positions before ``ids`` in a prefill run's ``out``: a constant KV prefix's
    length (:mod:`quantscope.zoo.prefix`), 0 without one."""
    return int(out["present.0.key"].shape[2]) - len(ids) if "present.0.key" in out else 0


def decode_feeds(prefill: Run, windows: Sequence[np.ndarray], steps: int
                 ) -> Iterator[dict[str, np.ndarray]]:
    """Decode-graph feeds: the last ``steps`` tokens of each window with the FP32 cache
    (a constant prefix, if the prefill graph has one, included)."""
    for ids in windows:
        out = prefill({"input_ids": ids[None]})
        before = prefix_length(out, ids)
        for t in range(len(ids) - steps, len(ids)):
            yield {"input_ids": ids[None, t:t + 1], **cache_of(out, before + t)}


def calibrate_phases(open_phase: OpenPhase, windows: TokenWindows, *, steps: int = 4,
                     method: str = "minmax") -> dict[str, Stats]:
    """Statistics of each phase graph on its own feeds (see module docstring); one graph
    (and its calibration session) alive at a time."""
    pre = open_phase("prefill")
    feeds = list(decode_feeds(runner(pre), windows.calibration, steps))  # caches: small
    release_memory()
    stats = {"prefill": calibrate(pre, find_groups(pre),
                                  ({"input_ids": w[None]} for w in windows.calibration),
                                  method=method)}
    del pre
    release_memory()
    dec = open_phase("decode")
    stats["decode"] = calibrate(dec, find_groups(dec), feeds, method=method)
    del dec
    release_memory()
    return stats


def position_absmax(model: Model | onnx.ModelProto, tensors: Sequence[str],
                    windows: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """FP32 prefill: per tensor [1, N, C], the max |x| over channels at each position (max
    over the windows) -- where the largest activations sit. Pass the graph already tapped
    (:func:`~quantscope.calibrate.collect.tapped_model`) to hold one copy less."""
    names = list(tensors)
    proto = tapped_model(model, names) if isinstance(model, Model) else model
    session = make_session(proto, optimize=True, arena=False)
    del proto
    out: dict[str, np.ndarray] = {}
    for ids in windows:
        for name, v in zip(names, session.run(names, {"input_ids": ids[None]}), strict=True):
            per_pos = np.abs(v.reshape(v.shape[1], -1)).max(-1)
            out[name] = np.maximum(out.get(name, per_pos), per_pos)
    del session
    release_memory()
    return out


def _emulated(open_phase: OpenPhase, phase: str, stats: Stats, plan: Plan,
              method: str | None) -> Run:
    run = runner(quantize_model(open_phase(phase), stats, plan, scheme=scheme_for(plan, None),
                                method=method).proto)
    release_memory()
    return run


def greedy_from(out: dict[str, np.ndarray], decode: Run, new_tokens: int,
                clock: dict[str, float] | None = None) -> list[int]:
    """Greedy tokens after a prefill run's ``out``: the decode loop on its cache (the
    decode seconds and steps added to ``clock['decode_s' / 'decode_steps']`` if given)."""
    tokens = [int(out["logits"][0, -1].argmax())]
    while len(tokens) < new_tokens:
        t0 = time.perf_counter()
        out = decode({"input_ids": np.array([[tokens[-1]]], np.int64), **cache_of(out)})
        if clock is not None:
            clock["decode_s"] += time.perf_counter() - t0
            clock["decode_steps"] += 1
        tokens.append(int(out["logits"][0, -1].argmax()))
    return tokens


def generate(prefill: Run, decode: Run, prompt: np.ndarray, new_tokens: int,
             clock: dict[str, float] | None = None) -> list[int]:
    """Greedy tokens after ``prompt``: one prefill run, then the decode loop on its cache."""
    return greedy_from(prefill({"input_ids": prompt[None]}), decode, new_tokens, clock)


def fp32_reading(fp32: Run, prompt: np.ndarray, tokens: Sequence[int]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """FP32's reading of greedy ``tokens`` after ``prompt`` (one prefill run over the prompt
    and every token but the last): per token, whether FP32 picks it itself after the same
    tokens, and its negative log-likelihood under FP32."""
    ids = np.concatenate([prompt, np.asarray(tokens[:-1], np.int64)])
    logits = fp32({"input_ids": ids[None]})["logits"][0, len(prompt) - 1:]
    want = np.asarray(tokens, np.int64)
    nll = -log_softmax(logits)[np.arange(len(want)), want]
    return logits.argmax(-1) == want, nll


def _last(out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A prefill run's outputs as decoding needs them: the last logits row and the cache."""
    return {k: v[:, -1:] if k == "logits" else v for k, v in out.items()}


@dataclass(frozen=True)
class _Pending:
    """What a window's decode steps need from its prefill runs (small: caches, ``steps``
    logit rows), so the emulated prefill session is gone before the decode one is made."""

    ids: np.ndarray
    start: int
    ref_logits: np.ndarray  # FP32 [steps, V] at positions start .. len - 2
    ref_cache: dict[str, np.ndarray]  # FP32 present.* of the whole window
    emu_cache: dict[str, np.ndarray]  # emulated past.* of the first ``start`` tokens
    before: int = 0  # cache positions before the window: a constant prefix's length


def _prefill_window(ids: np.ndarray, steps: int, fp32: Run, emu: Run,
                    acc: dict[str, NextToken], clock: dict[str, float]) -> _Pending:
    t0 = time.perf_counter()
    ref = fp32({"input_ids": ids[None]})
    clock["fp32_prefill_s"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    test = emu({"input_ids": ids[None]})
    clock["prefill_s"] += time.perf_counter() - t0
    acc["prefill"].add(ref["logits"][0, :-1], test["logits"][0, :-1], ids[1:])
    start, before = len(ids) - steps - 1, prefix_length(ref, ids)
    return _Pending(ids, start, ref["logits"][0, start:-1].copy(),
                    {k: v for k, v in ref.items() if k.startswith("present.")},
                    {k: v.copy() for k, v in cache_of(test, before + start).items()}, before)


def _decode_window(w: _Pending, emu: Run, acc: dict[str, NextToken],
                   clock: dict[str, float]) -> None:
    emu_cache, rows = w.emu_cache, {"decode_fp32_kv": [], "decode_emu_kv": []}
    for t in range(w.start, len(w.ids) - 1):
        token = {"input_ids": w.ids[None, t:t + 1]}
        t0 = time.perf_counter()
        fed_fp32 = emu({**token, **cache_of(w.ref_cache, w.before + t)})
        fed_emu = emu({**token, **emu_cache})
        clock["decode_s"] += time.perf_counter() - t0
        clock["decode_steps"] += 2
        emu_cache = cache_of(fed_emu)
        rows["decode_fp32_kv"].append(fed_fp32["logits"][0, 0])
        rows["decode_emu_kv"].append(fed_emu["logits"][0, 0])
    for phase, logits in rows.items():  # one block per window (its standard error)
        acc[phase].add(w.ref_logits, np.stack(logits), w.ids[w.start + 1:])


@dataclass(frozen=True)
class Fp32Greedy:
    """FP32's greedy continuation of each prompt (``tokens``), FP32's own reading of it
    (per token, the negative log-likelihood: :func:`fp32_reading`), and the seconds and
    steps its decode runs took."""

    tokens: tuple[tuple[int, ...], ...]
    own_nll: tuple[np.ndarray, ...]
    decode_s: float
    decode_steps: float


KEPT_GREEDY = 4  # the last continuations made in this process, kept by content
_GREEDY: Kept[str, Fp32Greedy] = Kept(KEPT_GREEDY)


def fp32_greedy(open_phase: OpenPhase, prompts: Sequence[np.ndarray], new_tokens: int
                ) -> Fp32Greedy:
    """FP32's greedy continuations of ``prompts`` (``new_tokens`` each), made once per
    process for the same graphs: they are keyed by both phase graphs' content (weights and
    a KV prefix included), the prompts and ``new_tokens``. A decoder run measures against
    them in its plan stage (twice), evaluate, w4, finetune and whatif; each made them
    again before (90-110 s each on smollm2-135m at 32 prompts x 64 tokens, 3 s to find
    again: ``bench/fp32_greedy.py``). The graphs are opened one at a time to key them; on
    a miss they are opened again to run. No prompts: nothing to make, no graph opened."""
    if not prompts:
        return Fp32Greedy((), (), 0.0, 0.0)
    h = hashlib.sha256(f"{new_tokens}".encode())
    for phase in ("prefill", "decode"):
        h.update(model_digest(open_phase(phase).proto).encode())
    for p in prompts:
        h.update(np.ascontiguousarray(p, np.int64).tobytes() + b"|")
    key = h.hexdigest()
    got = _GREEDY.get(key)
    if got is not None:
        return got
    fp32 = runner(open_phase("prefill"))
    fp32_decode = runner(open_phase("decode"))
    clock = {"decode_s": 0.0, "decode_steps": 0.0}
    tokens = [tuple(generate(fp32, fp32_decode, p, new_tokens, clock)) for p in prompts]
    own = tuple(fp32_reading(fp32, p, t)[1] for p, t in zip(prompts, tokens, strict=True))
    del fp32, fp32_decode
    release_memory()
    return _GREEDY.put(key, Fp32Greedy(tuple(tokens), own, clock["decode_s"],
                                       clock["decode_steps"]))


def evaluate_lm_plans(open_phase: OpenPhase, stats: dict[str, Stats],
                      plans: Mapping[str, Plan | Mapping[str, Plan]],
                      windows: TokenWindows, *, prompts: Sequence[np.ndarray] = (),
                      steps: int = 8, new_tokens: int = 32, method: str | None = None,
                      decode_windows: int | None = None, emulated: OpenPhase | None = None
                      ) -> dict[str, dict[str, dict[str, float]]]:
    """Per plan, per phase (:data:`LM_PHASES`, ``greedy``, ``time``): metric -> value.
    Decode runs on the first ``decode_windows`` evaluation windows (None: all of them).
    ``emulated``: the graphs the plans quantize when they are not ``open_phase``'s (the
    same graphs with repaired weights: GPTQ); ``open_phase`` stays the FP32 reference.
    A plan may be given per phase (``{"prefill": p, "decode": q}``: the subnets are
    compiled apart, so their activation precisions may differ)."""
    emulated = emulated or open_phase
    ref = fp32_greedy(open_phase, prompts, new_tokens)
    fp32_clock = {"decode_s": ref.decode_s, "decode_steps": ref.decode_steps}
    results: dict[str, dict[str, dict[str, float]]] = {}
    for label, plan in plans.items():
        acc = {p: NextToken() for p in LM_PHASES}
        clock = {"prefill_s": 0.0, "decode_s": 0.0, "decode_steps": 0.0,
                 "fp32_prefill_s": 0.0, "fp32_decode_s": fp32_clock["decode_s"],
                 "fp32_decode_steps": fp32_clock["decode_steps"]}
        per_phase = plan if isinstance(plan, Mapping) else {p: plan.for_phase(p)
                                                            for p in ("prefill", "decode")}
        emu = _emulated(emulated, "prefill", stats["prefill"], per_phase["prefill"], method)
        fp32 = runner(open_phase("prefill"))  # made after: not alive while emu is built
        pending = []
        for k, ids in enumerate(windows.evaluation):
            w = _prefill_window(ids, steps, fp32, emu, acc, clock)
            if decode_windows is None or k < decode_windows:  # keep only their caches
                pending.append(w)
        starts = [_last(emu({"input_ids": p[None]})) for p in prompts]
        del emu, fp32  # one emulated session at a time
        release_memory()
        emu = _emulated(emulated, "decode", stats["decode"], per_phase["decode"], method)
        for w in pending:
            _decode_window(w, emu, acc, clock)
        greedy, made = Greedy(), []
        for out, ref_tokens in zip(starts, ref.tokens, strict=True):
            made.append(greedy_from(out, emu, new_tokens))
            greedy.add(ref_tokens, made[-1])
        del emu, pending, starts
        release_memory()
        if made:  # FP32 reads each emulated continuation (one session, after emu's)
            fp32 = runner(open_phase("prefill"))
            for p, tokens, own in zip(prompts, made, ref.own_nll, strict=True):
                greedy.along(*fp32_reading(fp32, p, tokens), own)
            del fp32
        results[label] = {**{p: a.values() for p, a in acc.items()},
                          "greedy": greedy.values(), "time": clock}
        release_memory()
    return results


__all__ = ["LM_PHASES", "Fp32Greedy", "cache_of", "calibrate_phases", "decode_feeds",
           "evaluate_lm_plans", "fp32_greedy", "fp32_reading", "generate", "greedy_from",
           "position_absmax", "runner"]
