"""Quantization-aware distillation of a decoder run's plan, both phases (issue 33).

    python bench/llm_finetune.py RUN_FOLDER [--steps 60] [--lr 2e-5] [--batch 4]
        [--decode-positions 4] [--decode-weight 1] [--minutes 25] [--train-windows 265]
        [--tokens 20000] [--prompts 32] [--new-tokens 64] [--decode-steps 256]
        [--device cpu|cuda] [--weights OUT.npz] [--from-weights IN.npz] [--no-drift]
        [--held-stats] [--learn-ranges [--range-lr 1e-3]] [--regrid-every N] [--json OUT]

RUN_FOLDER is a finished ``quantscope run`` of a decoder (its ``model/`` graphs, the chosen
``plan.json``, ``stats.{prefill,decode}.npz`` and the KV prefix it records). Steps:

1. the training windows: the built-in text's calibration stream cut into windows of the
   run's length (``--train-windows``; 265 of 64 tokens on smollm2-135m's tokenizer), the
   text the calibration reads, disjoint from the evaluation documents;
2. :func:`quantscope.finetune.phases.distill_phases` on the prefixed prefill graph and the
   decode graph under the plan (the run's calibration, the grids held), one set of
   weights; ``--from-weights`` skips it and reads trained weights saved by ``--weights``;
3. the trained weights written into both graphs, the prefix's keys and values computed
   again from them (what the host would load), both phases calibrated again on the run's
   16 calibration windows (not with ``--held-stats`` or learned grids: the grids the
   training held or learned), and the plan measured by ONNX Runtime at the evaluate stage's
   amounts against the **original** FP32 graphs (``evaluate_lm_plans(..., emulated=)``),
   next to the run's own ``evaluate.json``;
4. the trained FP32 model against the original (its drift: what a float fallback runs).

PyTorch trains; ONNX Runtime measures every figure printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
from gptq_llm import _with_weights

from quantscope.analyze.prefix import compute_prefix, prefixed_opener
from quantscope.emulate.release import release_memory
from quantscope.finetune.phases import PhaseTuneConfig, distill_phases, phase_regrid
from quantscope.model.load import Model
from quantscope.serde import read_json, read_plan, read_stats
from quantscope.stages_llm import (
    LmSetup,
    _opener,
    format_lm_quality,
    lm_prefix,
    lm_text,
    open_phase,
    phase_file,
    recorded_prefix,
)
from quantscope.tasks.lm import load_lm_tokenizer, token_windows
from quantscope.tasks.lm_phases import calibrate_phases, evaluate_lm_plans
from quantscope.types import Plan, Precision


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _save(path: Path, weights: dict[str, np.ndarray]) -> None:
    names = list(weights)
    np.savez(path, names=np.array(names), **{f"w{i}": weights[n] for i, n in enumerate(names)})


def _load(path: Path) -> dict[str, np.ndarray]:
    z = np.load(path)
    return {str(n): z[f"w{i}"] for i, n in enumerate(z["names"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--decode-positions", type=int, default=4)
    ap.add_argument("--decode-weight", type=float, default=1.0)
    ap.add_argument("--minutes", type=float, default=25.0)
    ap.add_argument("--train-windows", type=int, default=265)
    ap.add_argument("--tokens", type=int, default=20_000)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--decode-steps", type=int, default=256)
    ap.add_argument("--device", help="cpu or cuda (default: CUDA when PyTorch sees a GPU)")
    ap.add_argument("--weights", type=Path)
    ap.add_argument("--from-weights", type=Path)
    ap.add_argument("--no-drift", action="store_true",
                    help="skip step 4 (the trained FP32 model against the original)")
    ap.add_argument("--learn-ranges", action="store_true",
                    help="LSQ: each phase's per-tensor activation grids learn too (the KV "
                         "cache's held); measured with them pinned per phase on the held grids")
    ap.add_argument("--range-lr", type=float, default=1e-3)
    ap.add_argument("--regrid-every", type=int, default=0,
                    help="calibrate both phases again on the current weights every N steps "
                         "and train on those grids")
    ap.add_argument("--held-stats", action="store_true",
                    help="measure the tuned weights on the grids they were trained with (the "
                         "run's calibration) instead of calibrating them again")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    spec = a.run / "model" / "model.prefill.onnx"
    plan: Plan = read_plan(a.run / "plan.json")
    stats = {p: read_stats(a.run / f"stats.{p}.npz") for p in ("prefill", "decode")}
    run_setup = read_json(a.run / "evaluate.json", "evaluation")["setup"]
    seq = int(run_setup["seq_len"])
    setup = LmSetup.at(seq, tokens=a.tokens, prompts=a.prompts, new_tokens=a.new_tokens,
                       decode_steps=a.decode_steps)
    windows, prompts = lm_text(spec, setup)
    kv = lm_prefix(spec, recorded_prefix(plan), windows)
    base = _opener(spec, kv)
    t_all = time.perf_counter()
    out: dict = {"run": str(a.run), "setup": setup.__dict__}
    learned: dict = {}
    if a.from_weights:
        weights = _load(a.from_weights)
        saved = a.from_weights.with_suffix(".ranges.json")
        if saved.is_file():
            learned = {p: {k: tuple(v) for k, v in r.items()}
                       for p, r in json.loads(saved.read_text()).items()}
        out["trained"] = {"from": str(a.from_weights)}
    else:
        tok = load_lm_tokenizer(phase_file(spec, "prefill"))
        train = token_windows(tok, seq_len=seq, calibration=a.train_windows,
                              evaluation=1).calibration
        config = PhaseTuneConfig(steps=a.steps, lr=a.lr, batch=a.batch,
                                 decode_positions=a.decode_positions,
                                 decode_weight=a.decode_weight, max_seconds=a.minutes * 60,
                                 device=a.device, learn_ranges=a.learn_ranges,
                                 range_lr=a.range_lr, regrid_every=a.regrid_every)
        regrid = phase_regrid(lambda phase: open_phase(spec, phase),
                              kv.kv.tokens if kv else (), windows, setup.steps)

        models = {p: base(p) for p in ("prefill", "decode")}
        res = distill_phases(models, stats, plan, train, config,
                             prefix=len(kv.kv.tokens) if kv else 0, progress=True,
                             regrid=regrid if a.regrid_every else None)
        del models
        release_memory()
        weights, learned = res.weights, res.ranges
        out["trained"] = {"config": config.__dict__, "steps": res.steps,
                          "seconds": round(res.seconds, 1), "windows": res.windows,
                          "log": list(res.log), "regrids": list(res.regrids),
                          "peak_rss_gb": round(_rss_gb(), 2)}
        print(res.summary(), f"peak RSS {_rss_gb():.2f} GB", flush=True)
        if a.weights:
            _save(a.weights, weights)
            if learned:
                a.weights.with_suffix(".ranges.json").write_text(json.dumps(learned))

    def tuned(phase: str) -> Model:
        return _with_weights(open_phase(spec, phase), weights, "QAT")

    prefix = compute_prefix(tuned("prefill"), kv.kv.tokens) if kv else None
    emulated = prefixed_opener(tuned, prefix)
    t0 = time.perf_counter()
    held = a.held_stats or bool(learned)
    out["grids"] = ("learned (LSQ), pinned per phase" if learned else
                    "held (the run's)" if held else "calibrated again")
    stats2 = stats if held else calibrate_phases(emulated, windows, steps=setup.steps)
    measured: Plan | dict[str, Plan] = plan
    if learned:  # each phase's learned grids pinned (the KV cache's stay the run's)
        measured = {p: dataclasses.replace(plan.for_phase(p), pinned=tuple(sorted(
            {**dict(plan.pinned), **r}.items()))) for p, r in learned.items()}
        out["learned_ranges"] = {p: len(r) for p, r in learned.items()}
    amounts = {"prompts": prompts, "steps": setup.steps, "new_tokens": setup.new_tokens,
               "decode_windows": setup.decode_windows}
    got = evaluate_lm_plans(base, stats2, {"plan + QAT": measured}, windows, **amounts,
                            emulated=emulated)
    run_eval = read_json(a.run / "evaluate.json", "evaluation")["plans"]
    said = {"data": windows.source, "setup": setup.__dict__, **({"prefix": kv.to_dict()} if kv else {})}
    print("\n".join(format_lm_quality({**said, "plans": {"plan (the run's)": run_eval["plan"],
                                                         **got}})), flush=True)
    drift = {} if a.no_drift else evaluate_lm_plans(
        base, stats2, {"QAT FP32 (nothing quantized)": Plan.uniform(Precision.FLOAT)}, windows,
        **amounts, emulated=emulated)
    out["plans"] = {"plan (the run's evaluate.json)": run_eval["plan"], **got, **drift}
    out["evaluation_s"] = round(time.perf_counter() - t0, 1)
    print("\n".join(format_lm_quality({**said, "plans": out["plans"]})))
    out["total_s"], out["peak_rss_gb"] = round(time.perf_counter() - t_all, 1), _rss_gb()
    print(f"total {out['total_s']:.0f} s; peak RSS {out['peak_rss_gb']:.2f} GB")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    sys.exit(main())
