"""The run's ``deploy`` stage: the compiled lengths, decided by the run
(:mod:`quantscope.stages.lengths`), and their files.

=====================  ==============================================================
``lengths.json``       always: the mode (``--lengths off|auto|N,N…``), whether buckets
                       were considered and why (not), and when they were: the kept
                       deployment measured on the held-out texts, the choice on the fit
                       texts and the best single model there
``deployment.json``    when measured: the deployment file ``quantscope route
                       --deployment`` reads (``{"buckets": [...]}``)
``len-N/``             per compiled length: ``model.onnx`` (the FP32 model for the
                       compiler), ``stats.npz``, ``plan.json`` and the target's export
                       formats (``.alls`` / QNN encodings: :func:`steps.formats`)
``as_scripted``        in ``lengths.json``, when a length's Hailo script leaves a
                       decision NOT SET (no layer name): the groups per script and the
                       deployment measured held out as the compiler would apply the
                       scripts (``scripted_plan``: precision at the default, range at
                       the compiler's min/max)
=====================  ==============================================================

The host router (token count -> compiled model, padding to its length) is written into
``io_snippet.py`` by the ``io`` stage, from ``lengths.json``.
"""

from __future__ import annotations

import re
import shutil
from typing import Any

import numpy as np

from quantscope import stages
from quantscope.pipeline import steps
from quantscope.pipeline.context import Context
from quantscope.pipeline.data import widest_text_batch
from quantscope.plan.deployment import Candidate, Deployment
from quantscope.progress import say
from quantscope.types import QuantscopeError

FORMAT = "quantscope.lengths/1"
FOLDER = re.compile(r"len-\d+")


def folder_of(seq_len: int) -> str:
    return f"len-{seq_len}"


def deploy(ctx: Context) -> steps.Done:
    """Decide, choose and measure the compiled lengths; write their files (module doc)."""
    from quantscope.stages import lengths as L

    o = ctx.opts
    mode = o.length_choice()
    _remove_stale(ctx)
    doc: dict[str, Any] = {"format": FORMAT, "mode": o.lengths}
    if mode is None:
        return _write(ctx, {**doc, "considered": False, "buckets": False,
                            "reason": "turned off (--lengths off): one compiled model"})
    model, rd, target = ctx.model(), ctx.data(), ctx.target()
    token_lengths = rd.fit.token_lengths
    longest = o.seq_len or widest_text_batch(rd.fit)
    decision = L.decide_lengths(model, target, token_lengths, longest=longest,
                                given=mode or None)
    doc.update({"considered": token_lengths is not None, "buckets": decision.buckets,
                "reason": decision.reason, "lengths": list(decision.seq_lens),
                "candidate_lengths": list(decision.made_at)})
    if not decision.buckets:
        return _write(ctx, doc)
    say(f"compiled lengths: {decision.reason}", show=ctx.progress)
    rmodel, rstats, final = steps.repaired(ctx)
    own = Candidate(name="plan", model=rmodel, stats=rstats, plan=final)
    allowed = ctx.allowed_warnings()
    cands, notes = L.length_candidates(model, stages.read_stats(ctx.path(steps.STATS)), target,
                                       decision.made_at, plan_target=final.target, own=own,
                                       allowed=allowed)
    try:
        result = L.deploy_lengths(model, rd.fit, rd.held_out, cands, target, o.target,
                                  max_cost=o.max_cost, seq_lens=decision.seq_lens,
                                  progress=ctx.progress, allowed=allowed)
    except QuantscopeError as e:  # nothing legal or within the cost: said, not fatal
        return _write(ctx, {**doc, "buckets": False,
                            "reason": f"no deployment of compiled lengths chosen: {e}"})
    say(f"compiled lengths: {result.reason}", show=ctx.progress)
    hn = stages.read_json_file(o.hn, "HN") if o.hn else None
    written = _write_buckets(ctx, result.deployment, hn)
    scripted = _as_scripted(ctx, model, rd.held_out, result, hn)
    doc.update({"candidates": [c.name for c in cands], "notes": list(notes),
                "pad_id": _pad_id(rd.fit), "inputs": _feeds(rd.fit),
                "deployment": result.to_dict(),
                **({"as_scripted": scripted} if scripted else {})})
    return _write(ctx, doc, (steps.DEPLOYMENT, *written))


def _as_scripted(ctx: Context, reference: Any, held_out: Any, result: Any,
                 hn: dict[str, Any] | None) -> dict[str, Any] | None:
    """The deployment as its lengths' Hailo scripts carry it, measured held out (module
    doc); None when no script leaves a decision that matters NOT SET. Only the lengths
    whose scripts leave a decision unset run again, on the texts routed to them; the other
    lengths' rows and the FP32 reference are the kept deployment's held-out measurement
    (``result.routed``: the same models, statistics and plans, the same texts)."""
    from quantscope.stages.route import routed_outputs

    alls = [name for fmt, name in steps.formats(ctx.target()) if fmt == "alls"]
    if not alls:
        return None
    deployment = result.deployment
    scripted, lost = stages.scripted_deployment(deployment, hn=hn)
    if not lost:
        return None
    say(f"compiled lengths: measuring the deployment as its scripts are written "
        f"({sum(map(len, lost.values()))} groups NOT SET)", show=ctx.progress)
    unchanged = frozenset(n for n in deployment.seq_lens if n not in lost)
    r = routed_outputs(reference, held_out, scripted, progress=ctx.progress, alone=False,
                       reuse=result.routed, unchanged=unchanged)
    assert r.data.task is not None
    metrics = r.data.task.metrics(r.reference, r.routed)
    return {"groups": {f"{folder_of(n)}/{alls[0]}": list(g) for n, g in lost.items()},
            "metrics": dict(metrics.values)}


def _write(ctx: Context, doc: dict[str, Any], files: tuple[str, ...] = ()) -> steps.Done:
    stages.write_json(ctx.path(steps.LENGTHS), doc)
    return steps.Done((steps.LENGTHS, *files))


def _remove_stale(ctx: Context) -> None:
    """The files of an earlier deployment in this folder (another choice may keep fewer)."""
    for p in ctx.folder.iterdir():
        if p.is_dir() and FOLDER.fullmatch(p.name):
            shutil.rmtree(p)
    (ctx.path(steps.DEPLOYMENT)).unlink(missing_ok=True)


def _write_buckets(ctx: Context, deployment: Deployment, hn: dict[str, Any] | None
                   ) -> list[str]:
    """Per compiled length its folder (module doc); ``deployment.json`` naming them."""
    written, entries = [], []
    for b in deployment.buckets:
        folder = folder_of(b.seq_len)
        ctx.path(folder).mkdir()
        names = {"model": f"{folder}/model.onnx", "stats": f"{folder}/stats.npz",
                 "plan": f"{folder}/plan.json"}
        stages.write_onnx(ctx.path(names["model"]), b.model.proto)
        stages.write_stats(ctx.path(names["stats"]), b.stats)
        stages.write_plan(ctx.path(names["plan"]), b.plan)
        written += names.values()
        for fmt, name in steps.formats(ctx.target()):
            stages.export_plan(b.model, b.stats, b.plan, fmt=fmt,
                               out=ctx.path(f"{folder}/{name}"), hn=hn)
            written.append(f"{folder}/{name}")
        entries.append({"seq_len": b.seq_len, **names})
    stages.write_json(ctx.path(steps.DEPLOYMENT), {"buckets": entries})
    return written


def _pad_id(fit: Any) -> int:
    """The id the data pads with (read from a padded batch: where the mask is 0), else 0."""
    enc = getattr(fit.task, "encoder", None)
    ids = enc.input_name("input_ids") if enc is not None else None
    mask = enc.input_name("attention_mask") if enc is not None else None
    for b in fit.evaluation:
        if ids in b and mask in b:
            pads = np.asarray(b[ids])[np.asarray(b[mask]) == 0]
            if pads.size:
                return int(pads[0])
    return 0


def _feeds(fit: Any) -> list[list[str]]:
    """(role, input name, dtype) of each text input the model takes (the router fills them:
    ``input_ids`` padded, ``attention_mask`` 1 then 0, ``token_type_ids`` 0)."""
    enc = getattr(fit.task, "encoder", None)
    return [[role, name, str(dtype)] for role, name, dtype in enc.inputs] if enc else []
