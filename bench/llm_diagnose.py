"""Where a decoder's prefill perplexity goes: one class of groups changed at a time.

    python bench/llm_diagnose.py [--model smollm2-135m | X.prefill.onnx] [--rotate DIR]
        [--smooth gated[:ALPHA]] [--prefix auto|none] [--calibration 8] [--evaluation 4] [--seq-len 64]
        [--variants all16,base,base+softmax,all16-softmax,...] [--json OUT]

Prefill only (next-token top-1 agreement with FP32, KL, perplexity ratio on the
evaluation windows): one FP32 run per window, then per variant one emulated prefill
graph. Variants:

=====================  ==============================================================
``a8`` / ``all16``     uniform a8_w8 / a16_w16
``base``               the planner's ``act16+w16`` candidate on these graphs (legal,
                       within ``--max-cost``)
``base+CLASS``         ``base`` with CLASS's groups at a16_w16 (legal or not)
``base+CLASS:P``       ``base`` with CLASS's groups at precision P (e.g. ``float``)
``all16-CLASS``        uniform a16_w16 with CLASS's groups at a8_w8
``all16-CLASS:P``      uniform a16_w16 with CLASS's groups at P
``V~CLASS=METHOD``     variant V with CLASS's outputs' range method METHOD (mse, …);
                       ``~`` repeats (``base~proj=mse~kv=mse``)
=====================  ==============================================================

Classes (by group name): :data:`quantscope.model.lm_classes.CLASSES`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from quantscope.emulate.release import release_memory
from quantscope.model.groups import find_groups
from quantscope.model.lm_classes import members
from quantscope.plan.phase_search import candidate_plans, rank_by_range
from quantscope.stages_llm import (
    LmSetup,
    _opener,
    lm_prefix,
    lm_text,
    rewrite_phase_files,
    smooth_phase_files,
)
from quantscope.targets import load_target
from quantscope.tasks.lm import NextToken
from quantscope.tasks.lm_phases import _emulated, calibrate_phases, runner
from quantscope.types import Plan, Precision


def variant(label: str, names: list[str], base: Plan, target: str,
            outputs: dict[str, tuple[str, ...]] | None = None) -> Plan:
    """The plan a variant label names; ``LABEL~CLASS=METHOD`` also sets the range method of
    CLASS's group outputs (``mse``, ``percentile``; ``outputs``: group -> its output
    tensors, by default the group's own name)."""
    import dataclasses

    if "~" in label:  # LABEL~CLASS=METHOD[~CLASS=METHOD…]
        label, *rests = label.split("~")
        plan = variant(label, names, base, target, outputs)
        ranges = dict(plan.ranges)
        for rest in rests:
            cls, _, method = rest.partition("=")
            ranges |= {t: method for n in members(names, cls)
                       for t in (outputs or {}).get(n, (n,))}
        return dataclasses.replace(plan, ranges=tuple(ranges.items()))
    if label == "a8":
        return Plan(default=Precision.A8_W8, target=target)
    if label == "all16":
        return Plan(default=Precision.A16_W16, target=target)
    if label == "base":
        return base
    m = re.fullmatch(r"(base\+|all16-)([\w.]+)(?::(\w+))?", label)
    if not m:
        raise SystemExit(f"unknown variant {label!r}")
    start, cls, prec = m.groups()
    if start == "base+":
        p = Precision.parse(prec or "a16_w16")
        over = dict(base.overrides) | {n: p for n in members(names, cls)}
        return Plan(default=base.default, target=target, overrides=tuple(over.items()))
    p = Precision.parse(prec or "a8_w8")
    return Plan(default=Precision.A16_W16, target=target,
                overrides=tuple((n, p) for n in members(names, cls)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rotate", help="folder: rotate the model first (kept there)")
    ap.add_argument("--smooth", help="SITES[:ALPHA] (norms, gated, all): SmoothQuant the "
                    "(rotated) graphs first, calibrated with --prefix; kept in --rotate's "
                    "folder or beside --model")
    ap.add_argument("--prefix", default="auto")
    ap.add_argument("--target", default="hailo10h")
    ap.add_argument("--max-cost", type=float, default=1.5)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--calibration", type=int, default=8)
    ap.add_argument("--evaluation", type=int, default=4)
    ap.add_argument("--variants", default="all16,base")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    spec: str | Path = a.model
    if a.rotate:
        out = Path(a.rotate) / "rot.prefill.onnx"
        if not out.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            print(rewrite_phase_files(a.model, "rotate", out), flush=True)
        spec = out
    setup0 = LmSetup(seq_len=a.seq_len, calibration=a.calibration, evaluation=1, steps=4)
    if a.smooth:
        sites, _, alpha = a.smooth.partition(":")
        folder = Path(a.rotate) if a.rotate else Path(str(spec)).parent
        out = folder / f"smooth-{sites}-{alpha or '0.5'}-c{a.calibration}.prefill.onnx"
        if not out.is_file():
            print(smooth_phase_files(spec, out, alpha=float(alpha or 0.5), setup=setup0,
                                     sites=sites, prefix=a.prefix), flush=True)
        spec = out
    setup = LmSetup(seq_len=a.seq_len, calibration=a.calibration, evaluation=a.evaluation,
                    steps=4)
    windows, _ = lm_text(spec, setup)
    kv = lm_prefix(spec, a.prefix, windows)
    opener = _opener(spec, kv)
    print(f"prefix: {kv.to_dict() if kv else None}", flush=True)
    stats = calibrate_phases(opener, windows, steps=setup.steps)
    print(f"calibrated ({time.perf_counter() - t0:.0f} s)", flush=True)
    labels = a.variants.split(",")
    models = {p: opener(p) for p in ("prefill", "decode")}
    found = find_groups(models["prefill"]).groups
    names = [g.name for g in found]
    outputs = {g.name: tuple(g.outputs) for g in found}
    base = Plan(default=Precision.A8_W8, target=a.target)
    if any(x.startswith("base") for x in labels):
        ranked = rank_by_range(find_groups(models["prefill"]), list(stats.values()))
        base = candidate_plans(models, load_target(a.target), ranked, a.seq_len,
                               a.max_cost)["act16+w16"].for_phase("prefill")
        print(f"base: act16+w16, {len(base.overrides)} groups at a16_w16", flush=True)
    del models
    release_memory()
    fp32 = runner(opener("prefill"))
    refs = [fp32({"input_ids": w[None]})["logits"][0, :-1] for w in windows.evaluation]
    del fp32
    release_memory()
    rows = {}
    for label in labels:
        t1 = time.perf_counter()
        plan = variant(label, names, base, a.target, outputs)
        emu = _emulated(opener, "prefill", stats["prefill"], plan, None)
        acc = NextToken()
        for ref, ids in zip(refs, windows.evaluation, strict=True):
            acc.add(ref, emu({"input_ids": ids[None]})["logits"][0, :-1], ids[1:])
        del emu
        release_memory()
        v = acc.values()
        n16 = sum(1 for n in names if plan.precision_of(n) is Precision.A16_W16)
        rows[label] = {**v, "groups_a16_w16": n16, "seconds": time.perf_counter() - t1}
        print(f"{label:<22} a16_w16 {n16:>4}  top-1 {v['top1_agreement']:.3f}  KL "
              f"{v['kl']:.3f}  ppl ratio {v['ppl_ratio']:.3f} (± {v['ppl_ratio_se']:.3f})  "
              f"[{time.perf_counter() - t1:.0f} s]", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1))
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
