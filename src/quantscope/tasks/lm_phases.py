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
greedy               ``new_tokens`` greedy tokens per prompt, FP32 and emulated, each
                     with its own prefill then decode loop
time                 seconds in the emulated prefill and decode runs, per plan; FP32
                     too: the reference prefill runs of that plan's scoring, and the
                     FP32 decode steps of greedy generation (measured once, same process)
memory               a phase graph is opened (``open_phase``) only while it is needed:
                     a session keeps its own copy of the weights, so at most the FP32
                     prefill session and one plan's two emulated sessions are alive
===================  =================================================================
"""

from __future__ import annotations

import ctypes
import gc
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx

from quantscope.calibrate.collect import calibrate, tapped_model
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.emulate.session import make_session
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.phases import PAST_PREFIX
from quantscope.tasks.lm import Greedy, NextToken, TokenWindows
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


def decode_feeds(prefill: Run, windows: Sequence[np.ndarray], steps: int
                 ) -> Iterator[dict[str, np.ndarray]]:
    """Decode-graph feeds: the last ``steps`` tokens of each window with the FP32 cache."""
    for ids in windows:
        out = prefill({"input_ids": ids[None]})
        for t in range(len(ids) - steps, len(ids)):
            yield {"input_ids": ids[None, t:t + 1], **cache_of(out, t)}


def release_memory() -> None:
    """Hand freed heap back to the OS: a 650 MB model freed inside glibc's arenas would
    otherwise stay in the RSS and stack up with the next phase's copy."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


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


def position_absmax(model: Model, tensors: Sequence[str], windows: Sequence[np.ndarray]
                    ) -> dict[str, np.ndarray]:
    """FP32 prefill: per tensor [1, N, C], the max |x| over channels at each position (max
    over the windows) -- where the largest activations sit."""
    names = list(tensors)
    session = make_session(tapped_model(model, names))
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


def generate(prefill: Run, decode: Run, prompt: np.ndarray, new_tokens: int,
             clock: dict[str, float] | None = None) -> list[int]:
    """Greedy tokens after ``prompt``: one prefill run, then the decode loop on its cache
    (the decode seconds and steps added to ``clock['decode_s' / 'decode_steps']`` if given)."""
    out = prefill({"input_ids": prompt[None]})
    tokens = [int(out["logits"][0, -1].argmax())]
    while len(tokens) < new_tokens:
        t0 = time.perf_counter()
        out = decode({"input_ids": np.array([[tokens[-1]]], np.int64), **cache_of(out)})
        if clock is not None:
            clock["decode_s"] += time.perf_counter() - t0
            clock["decode_steps"] += 1
        tokens.append(int(out["logits"][0, -1].argmax()))
    return tokens


def _score_window(ids: np.ndarray, steps: int, fp32: Run, emu: dict[str, Run],
                  acc: dict[str, NextToken], clock: dict[str, float]) -> None:
    t0 = time.perf_counter()
    ref = fp32({"input_ids": ids[None]})
    clock["fp32_prefill_s"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    test = emu["prefill"]({"input_ids": ids[None]})
    clock["prefill_s"] += time.perf_counter() - t0
    acc["prefill"].add(ref["logits"][0, :-1], test["logits"][0, :-1], ids[1:])
    start = len(ids) - steps - 1
    emu_cache = cache_of(test, start)
    for t in range(start, len(ids) - 1):
        token = {"input_ids": ids[None, t:t + 1]}
        t0 = time.perf_counter()
        fed_fp32 = emu["decode"]({**token, **cache_of(ref, t)})
        fed_emu = emu["decode"]({**token, **emu_cache})
        clock["decode_s"] += time.perf_counter() - t0
        clock["decode_steps"] += 2
        emu_cache = cache_of(fed_emu)
        target = ids[t + 1:t + 2]
        acc["decode_fp32_kv"].add(ref["logits"][0, t:t + 1], fed_fp32["logits"][0], target)
        acc["decode_emu_kv"].add(ref["logits"][0, t:t + 1], fed_emu["logits"][0], target)


def evaluate_lm_plans(open_phase: OpenPhase, stats: dict[str, Stats], plans: dict[str, Plan],
                      windows: TokenWindows, *, prompts: Sequence[np.ndarray] = (),
                      steps: int = 8, new_tokens: int = 32,
                      method: str | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """Per plan, per phase (:data:`LM_PHASES`, ``greedy``, ``time``): metric -> value."""
    fp32 = runner(open_phase("prefill"))
    fp32_decode = runner(open_phase("decode"))
    fp32_clock = {"decode_s": 0.0, "decode_steps": 0.0}
    fp32_greedy = [generate(fp32, fp32_decode, p, new_tokens, fp32_clock) for p in prompts]
    del fp32_decode
    release_memory()
    results: dict[str, dict[str, dict[str, float]]] = {}
    for label, plan in plans.items():
        emu = {p: _emulated(open_phase, p, stats[p], plan, method) for p in ("prefill", "decode")}
        acc = {p: NextToken() for p in LM_PHASES}
        clock = {"prefill_s": 0.0, "decode_s": 0.0, "decode_steps": 0.0,
                 "fp32_prefill_s": 0.0, "fp32_decode_s": fp32_clock["decode_s"],
                 "fp32_decode_steps": fp32_clock["decode_steps"]}
        for ids in windows.evaluation:
            _score_window(ids, steps, fp32, emu, acc, clock)
        greedy = Greedy()
        for prompt, ref_tokens in zip(prompts, fp32_greedy, strict=True):
            greedy.add(ref_tokens, generate(emu["prefill"], emu["decode"], prompt, new_tokens))
        results[label] = {**{p: a.values() for p, a in acc.items()},
                          "greedy": greedy.values(), "time": clock}
        del emu
        release_memory()
    return results


__all__ = ["LM_PHASES", "cache_of", "calibrate_phases", "decode_feeds", "evaluate_lm_plans",
           "generate", "position_absmax", "runner"]
