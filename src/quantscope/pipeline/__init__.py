"""``quantscope run``: model + data + target -> every stage's file in one folder, resumable.

calibrate -> analyze -> plan (repairs searched with the precisions) -> repair -> check ->
evaluate (held-out: FP32, uniform a8_w8, the plan) -> deploy (the compiled lengths,
:mod:`.deploy`) -> export (QDQ ONNX + the target's
formats) -> io -> report (+ verdict). Each stage is a function of :mod:`.steps` reading
its inputs from the folder; ``run.json`` (:mod:`.manifest`) records, per stage, a hash of
its options and input digests, so a rerun skips what is done and a killed run resumes at
the stage it was in. The rewritten model (``--rewrites``; with ``auto``, run's default, the
choice measured on the fit data: :mod:`.auto`) is resumable state too:
``rewritten.onnx`` with its key in ``rewritten.json`` (:func:`.context.rewritten_key`), so
a rerun neither recalibrates nor rewrites while the given model, the rewrites and the data
are the same. This layer sits between ``cli`` and ``stages``.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantscope.pipeline import steps
from quantscope.pipeline.context import (
    Context,
    RunOptions,
    keep_rewritten,
    reads_text_as,
    rewrite_run_model,
)
from quantscope.pipeline.deploy import deploy as deploy_step
from quantscope.pipeline.manifest import Manifest, remember_digests, stage_key
from quantscope.pipeline.memory import (
    calibrate_estimate,
    deploy_estimate,
    evaluate_estimate,
    plan_estimate,
)
from quantscope.pipeline.verdict import report as report_step
from quantscope.types import QuantscopeError

if TYPE_CHECKING:
    from quantscope.analyze.stage_memory import StageMemory
    from quantscope.model.load import Model

LOCK = ".run.lock"


@dataclass(frozen=True)
class StageSpec:
    run: steps.Step
    reads: tuple[str, ...]  # files of earlier stages
    options: tuple[str, ...]  # RunOptions fields its result depends on
    data: bool  # reads the model's data
    ranked: bool = False  # its result depends on the engine that ranks (--rank-engine)
    # a finished stage runs again when this says so (the plan stage: its search was
    # stopped by a smaller --budget than this run's: steps.plan_budget_grew)
    redo: Callable[[Context], bool] | None = None
    # the stage's memory estimate, said and kept before its work (pipeline/memory.py)
    memory: Callable[[Context], StageMemory | None] | None = None
    # the versions of rules its result follows beyond its options (the plan stage: the
    # repair offers' out-of-sample check; plan and evaluate on face data: the units of a
    # dB figure's noise), in its key: a folder made under an older rule
    # runs the stage again
    rules: Callable[[Context], dict[str, str]] | None = None


# options added after run folders existed: in a stage's key only when set, so a folder
# made before them resumes without redoing the stage
UNKEYED_AT_NONE = frozenset({"race", "prefixes"})

_REPAIRED = (steps.REPAIRED, steps.REPAIRED_STATS, steps.REPAIRED_PLAN)
STAGES: dict[str, StageSpec] = {
    "calibrate": StageSpec(steps.calibrate, (), ("method",), True, memory=calibrate_estimate),
    "analyze": StageSpec(steps.analyze, (steps.STATS,),
                         ("target", "proxy", "metric", "seq_len", "input_shapes"), True),
    "plan": StageSpec(steps.plan, (steps.STATS, steps.ANALYSIS),
                      ("target", "max_cost", "seq_len", "input_shapes", "metric", "goal",
                       "repairs", "repairs_given", "lengths",
                       "repair_batches", "race", "auto_rewrites", "allow_warnings"), True,
                      ranked=True, redo=steps.plan_budget_grew, memory=plan_estimate,
                      rules=steps.plan_rules),
    # the repairs, then the fine-tune (--finetune; auto: when the goal is missed on the fit
    # data: pipeline/tune.py), whose outcome depends on the goal and the metric
    "repair": StageSpec(steps.repair, (steps.STATS, steps.PLAN),
                        ("target", "repair_batches", "finetune", "goal", "metric"), True),
    "check": StageSpec(steps.check, _REPAIRED,
                       ("target", "seq_len", "input_shapes", "allow_warnings"), False),
    # hn: the plan as its Hailo script carries it (as_scripted) depends on the layer names
    "evaluate": StageSpec(steps.evaluate, (steps.STATS, *_REPAIRED),
                          ("target", "metric", "whatif", "hn"), True,
                          memory=evaluate_estimate, rules=steps.noise_rules),
    # the compiled lengths (--lengths): candidates per length chosen on the fit texts,
    # measured on the held-out texts (pipeline/deploy.py)
    "deploy": StageSpec(deploy_step, (steps.STATS, *_REPAIRED),
                        ("target", "max_cost", "seq_len", "lengths", "hn", "allow_warnings"),
                        True, memory=deploy_estimate),
    "export": StageSpec(steps.export, _REPAIRED, ("target", "hn"), False),
    "io": StageSpec(steps.io, (*_REPAIRED, steps.LENGTHS), ("prefixes",), False),
    "report": StageSpec(report_step, (steps.ANALYSIS, steps.PLAN, steps.CHECK, steps.EVALUATE,
                                       steps.IO, steps.ALLS, steps.QNN, *_REPAIRED,
                                       steps.LENGTHS),
                        ("model", "data", "eval_data", "target", "goal", "max_cost", "metric"),
                        False),
}


@dataclass(frozen=True)
class RunResult:
    folder: Path
    ran: tuple[str, ...]  # stages computed now
    skipped: tuple[str, ...]  # stages already done with the same inputs
    verdict: dict[str, Any]


def run_pipeline(opts: RunOptions, *, force: str | None = None,
                 progress: bool = True) -> RunResult:
    """Run every stage not yet done on these inputs (``force``: rerun from that stage)."""
    from quantscope import stages

    opts.check()
    if force is not None and force not in STAGES:
        raise QuantscopeError(f"unknown stage '{force}' for --force: use {', '.join(STAGES)}")
    check_apart(opts)
    if Path(opts.out).is_dir():  # a run using the folder now: said before any work (the
        with _lock(Path(opts.out)):  # auto rewrites measure for minutes), held from below
            pass
    # the given model and the fit data are opened once here, for every check below (a
    # rerun whose stages are all done needs nothing more: the rewritten model it reuses
    # is loaded only when a stage runs)
    given = stages.open_model(opts.model)
    fit = _open_fit(given, opts)
    opts = at_data_length(opts, progress, model=given, fit=fit)
    opts, size_line = at_data_size(opts, model=given, fit=fit)
    # every input is opened (and a split that cannot be made fails) before any stage runs
    # and before the run folder exists: a bad input leaves nothing behind; the given
    # model is checked (a rewrite keeps the inputs and outputs), before auto measures
    _check_out(opts.out)
    _check_inputs(given, opts, progress, fit=fit)
    if size_line is not None:  # said once the inputs passed: a bad input is one line
        from quantscope.progress import say

        say(size_line, show=progress)
    remember_digests(Path(opts.out))  # files hashed before, unchanged: not hashed again
    made = rewrite_run_model(opts, progress=progress, given=given)
    folder = _folder(opts.out)
    with _lock(folder):
        _remove_stale(folder)
        keep_rewritten(folder, opts, made)
        # held for the stages: the loaded model, not the rewrite's own proto (written
        # above) nor the given model (only what tells whether text reads alike)
        made = dataclasses.replace(made, proto=None)
        early: dict[str, Any] = {"made": made, **({"model": made.model} if made.model else {}),
                                 "given_fit": (reads_text_as(given), fit)}
        del given
        return _run(Context(opts, folder, progress=progress, _cache=early), force)


def _open_fit(model: Model, opts: RunOptions) -> Any:
    """The fit data as the checks open it (:func:`check_run_inputs`), once."""
    from quantscope import stages

    return stages.open_data(opts.data, model, tokenizer=opts.tokenizer, max_pairs=opts.pairs,
                            layout=opts.layout, batch_axes=dict(opts.batch_axes) or None,
                            show=False, prefixes=opts.prefixes, calib_texts=opts.calib_texts)


def at_data_length(opts: RunOptions, progress: bool, *, model: Model | None = None,
                   fit: Any = None) -> RunOptions:
    """Without ``--seq-len`` (and ``--input-shape``), retrieval text fixes the length the
    whole run rewrites, plans, checks and compiles at: its widest fit batch (the longest
    text, truncated by the tokenizer), said in one line, as if given. Without it a target
    rule that depends on the size (``hailo.super_defuse``) cannot be judged, so the
    planner had to keep everything it touches at 8 bit and the auto rewrites could not
    ask whether ``tokensplit`` applies."""
    from quantscope.pipeline.data import _is_pairs, open_fit_data, widest_text_batch

    if opts.seq_len is not None or opts.input_shapes or not _is_pairs(opts.data):
        return opts
    from dataclasses import replace

    from quantscope import stages

    if fit is None:  # pairs: the fit data is the data's first --pairs pairs as opened
        model = model if model is not None else stages.open_model(opts.model)
        fit = open_fit_data(model, opts.data, eval_data=opts.eval_data, pairs=opts.pairs,
                            tokenizer=opts.tokenizer, prefixes=opts.prefixes,
                            calib_texts=opts.calib_texts)
    widest = widest_text_batch(fit)
    if widest is None:
        return opts
    from quantscope.progress import say

    say(f"seq-len: {widest} tokens, the longest fit text (give --seq-len N to plan, check "
        "and compile at another length)", show=progress)
    return replace(opts, seq_len=widest)


def at_data_size(opts: RunOptions, *, model: Model, fit: Any
                 ) -> tuple[RunOptions, str | None]:
    """Without ``--input-shape`` (and ``--seq-len``), tensor data whose every batch gives
    an input with open sizes (an image's H, W) the same shape fixes it for the whole run,
    as if given; and the line that says so (:mod:`quantscope.tasks.sizes`); with an
    ``--input-shape`` the data's samples do not have, the warning that says so."""
    from quantscope.pipeline.data import _is_pairs

    if opts.input_shapes and opts.seq_len is None and not _is_pairs(opts.data):
        from quantscope.tasks.sizes import other_size_line

        return opts, other_size_line(model, fit, opts.input_shapes)
    if opts.seq_len is not None or opts.input_shapes or _is_pairs(opts.data):
        return opts, None
    from dataclasses import replace

    from quantscope.tasks.sizes import at_data_shapes

    shapes, line = at_data_shapes(model, fit)
    return replace(opts, input_shapes=shapes, input_shapes_from_data=bool(shapes)), line


def _check_inputs(model: Model, opts: RunOptions, progress: bool, *, fit: Any = None) -> None:
    """The inputs, the goal, the batch axes and the input shapes checked against ``model``
    (before the run folder exists); ``fit``: the fit data as :func:`_open_fit` opened it."""
    from quantscope.model.groups import refuse_unemulated

    refuse_unemulated(model)  # control flow: refused before anything is said or measured
    check_run_inputs(model, opts, fit=fit)
    from quantscope.pipeline.data import _is_pairs

    if not _is_pairs(opts.data):  # the analysis compares rows: one size per input
        from quantscope.tasks.sizes import check_one_size

        check_one_size(model, fit if fit is not None else _open_fit(model, opts), opts.data,
                       "run")
    # a length the model's position table cannot hold (--seq-len, a token --input-shape)
    from quantscope.tasks.positions import check_token_lengths

    check_token_lengths(model, opts.seq_len, opts.input_shapes)
    if opts.metric:  # a --metric the data's task does not give: refused before any work
        from quantscope.analyze.measure import check_metric

        check_metric(model, fit if fit is not None else _open_fit(model, opts), opts.metric)
    # a goal the metric cannot take fails before the run folder exists
    head = Context(opts, Path(opts.out), progress=progress,
                   _cache={"model": model}).check_goal(fit)
    if opts.batch_axes:  # a --batch-axis the model refutes fails before the folder exists
        from quantscope.tasks.tensors import check_batch_axes

        check_batch_axes(model, dict(opts.batch_axes))
    if opts.input_shapes:  # an --input-shape the model contradicts fails before the folder
        from quantscope.model.shapes import given_shapes, resolve_shapes

        resolve_shapes(model, given_shapes(model, opts.seq_len, opts.input_shapes))
    if opts.hn:  # an --hn that is no parsed HN fails now, not at the export stage
        from quantscope import stages
        from quantscope.export.hailo_alls import hn_layers
        from quantscope.targets import load_target

        target = load_target(opts.target)
        if "alls" not in target.formats:  # said, not silently unused
            raise QuantscopeError(f"--hn gives the Hailo layer names of model.alls, and "
                                  f"--target {opts.target} ({target.vendor}) writes no .alls: "
                                  "leave --hn out")
        hn_layers(stages.read_json_file(opts.hn, "HN"))
    # last (one FP32 pass): a headline with no value on the fit part cannot rank plans
    _check_figure(model, opts, fit if fit is not None else _open_fit(model, opts))
    if head is not None and opts.goal is not None:  # said once every input passed
        from quantscope.progress import say
        from quantscope.report import fmt

        say(f"goal: {fmt.goal(head.metric, opts.goal, head.higher_is_better)} on the held-out "
            "data", show=progress)


def _check_figure(model: Model, opts: RunOptions, opened: Any) -> None:
    """A headline with no value on the fit part (FP32 against itself: a ``where=`` gate no
    score passes there) is refused before the run folder exists: the search ranks by it
    (:func:`quantscope.analyze.figure_check.check_figure`)."""
    from quantscope.analyze.figure_check import check_figure
    from quantscope.analyze.measure import headline
    from quantscope.pipeline.data import fit_part

    fit = fit_part(opened, opts.data, eval_data=opts.eval_data)
    what = "the fit data" if opts.eval_data else f"the fit part of {opts.data}"
    check_figure(model, fit, headline(fit, opts.metric).metric, what=what)


MIN_FIT_SAMPLES = 2  # the analysis compares samples (a collapse needs two rows to show)


def check_run_inputs(model: Model, opts: RunOptions, *, fit: Any = None) -> None:
    """The target, the data and the evaluation data, opened and checked against the model
    (input names, shapes, token ids), and enough tensor samples to fit a plan on: after
    holding out half for evaluation (without ``--eval-data``) at least
    :data:`MIN_FIT_SAMPLES` remain. ``fit``: the data as :func:`_open_fit` opened it."""
    from quantscope import stages
    from quantscope.targets import load_target
    from quantscope.targets.accept import allowed_warnings
    from quantscope.tasks.tensors import check_token_ids
    from quantscope.types import batch_rows

    allowed_warnings(load_target(opts.target), opts.allow_warnings)  # refused in one line
    axes = dict(opts.batch_axes) or None
    fit = fit if fit is not None else _open_fit(model, opts)
    sets = [(opts.data, fit)]
    if opts.eval_data:
        from quantscope.pipeline.data import refuse_overlap, refuse_same_data

        refuse_same_data(opts.data, opts.eval_data)
        held = stages.open_data(opts.eval_data, model, tokenizer=opts.tokenizer,
                                max_pairs=opts.pairs, layout=opts.layout, batch_axes=axes,
                                show=False, prefixes=opts.prefixes)
        refuse_overlap(opts.data, opts.eval_data, fit, held, opts.pairs)
        sets.append((opts.eval_data, held))
    for spec, ds in sets:
        for batch in (*ds.calibration, *ds.evaluation):
            check_token_ids(batch, model, spec)
    if fit.task is not None and not getattr(fit.task, "row_local", False):
        return  # a task's data (pairs, faces) counts its own
    rows = [batch_rows(b) for b in fit.calibration]
    if opts.eval_data:
        fitted, how = sum(rows), ""
    elif len(rows) >= 2:
        fitted, how = sum(rows[: (len(rows) + 1) // 2]), " after holding out half its files"
    else:
        fitted, how = (sum(rows) + 1) // 2, " after holding out half for evaluation"
    if fitted < MIN_FIT_SAMPLES:
        raise QuantscopeError(
            f"data '{opts.data}' leaves {fitted} sample(s) to fit the plan on{how}, and run "
            f"needs at least {MIN_FIT_SAMPLES} (the analysis compares samples): give more "
            + ("samples" if opts.eval_data else
               f"samples ({2 * MIN_FIT_SAMPLES - 1} or more), or --eval-data for the "
               "evaluation"))


def _run(ctx: Context, force: str | None) -> RunResult:
    from quantscope.analyze.memory import peak_bytes, reset_peak
    from quantscope.emulate.release import STAGE_RELEASE_GROWTH, release_memory
    from quantscope.progress import say
    from quantscope.serde import read_json

    folder, progress = ctx.folder, ctx.progress
    # a stage an earlier process started and never finished (SIGKILL: the OOM killer) said
    manifest = Manifest(folder, say=lambda line: say(line, show=progress))
    if force is not None:
        manifest.forget(list(STAGES)[list(STAGES).index(force):])
    ran, skipped = [], []
    for name, spec in STAGES.items():
        key = _key(ctx, manifest, name, spec)
        done = manifest.done(name, key)
        if done and spec.redo is not None and spec.redo(ctx):
            done = False
            say(f"[{name}] stopped by a smaller --budget before: continuing from the "
                "evaluation cache", show=progress)
        if done:
            skipped.append(name)
            say(f"[{name}] done already (same inputs): skipped", show=progress)
            continue
        gone = manifest.changed(name, key)
        say(f"[{name}] …" + (f" ({', '.join(gone[:3])}{' …' if len(gone) > 3 else ''} changed "
                            "or missing since this stage wrote it: redone)" if gone else ""),
            show=progress)
        # the process's peak before its first stage (the checks, the auto choice of the
        # rewrites), then each stage's own: the reset also resets what getrusage and
        # `time -v` report (the last stage's peak)
        before = None if ran else peak_bytes()
        # what the stages before left behind goes back first, when it is worth a collection
        # (one walks every object the process holds: 50-200 ms, where a tiny model's stage
        # runs for a tenth of a second)
        release_memory(growth=STAGE_RELEASE_GROWTH)
        reset_peak()
        start = time.perf_counter()
        done = manifest.run(name, _estimated, name, spec, ctx)  # run.json: started, until recorded
        manifest.record(name, key, done.files, time.perf_counter() - start, done.timings,
                        peak=peak_bytes(), before=before)
        ran.append(name)
    verdict = read_json(folder / steps.VERDICT, "verdict")
    return RunResult(folder, tuple(ran), tuple(skipped), verdict)


def _estimated(name: str, spec: StageSpec, ctx: Context) -> steps.Done:
    """The stage, its memory estimate said and kept first (:mod:`.memory`)."""
    memory = spec.memory(ctx) if spec.memory is not None else None
    if memory is not None:  # None: the stage decided it has nothing heavy to do
        from quantscope.pipeline.memory import say_estimate

        say_estimate(name, memory, show=ctx.progress)
    return spec.run(ctx)


@contextmanager
def _lock(folder: Path) -> Iterator[None]:
    """One run per folder at a time (the lock dies with its process, even on SIGKILL)."""
    import fcntl

    with (folder / LOCK).open("w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise QuantscopeError(f"another quantscope run is using '{folder}': wait for it "
                                  "or use another --out") from None
        yield


def _check_out(out: str) -> None:
    """``--out`` names a folder whose parent exists (checked, nothing created)."""
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise QuantscopeError(f"--out '{out}' is a file: give a folder for the run's files")
    if not folder.parent.is_dir():
        raise QuantscopeError(f"--out '{out}': the folder '{folder.parent}' does not exist")
    if not folder.exists():  # a folder can be made there (made and removed: /proc, a
        try:                 # read-only file system, no permission fail here, not late)
            os.rmdir(tempfile.mkdtemp(prefix=".quantscope-", dir=folder.parent))
        except OSError as e:
            raise QuantscopeError(f"--out '{out}': cannot make a folder in '{folder.parent}' "
                                  f"({e.strerror}): give a folder you can write to") from None


def _written_here(rel: Path) -> bool:
    """Whether a run writes (or removes) the path ``rel`` of its folder: a stage's file,
    the run's own, or anything under ``evals/`` or a compiled length's ``len-N/``."""
    from quantscope.pipeline.context import REWRITTEN, REWRITTEN_KEY
    from quantscope.pipeline.data import HELDOUT_PAIRS
    from quantscope.pipeline.deploy import FOLDER
    from quantscope.pipeline.manifest import MANIFEST

    top = rel.parts[0]
    if len(rel.parts) > 1:
        return top == steps.EVALS or FOLDER.fullmatch(top) is not None
    names = {v for k, v in vars(steps).items() if k.isupper() and isinstance(v, str)}
    return top in names | {HELDOUT_PAIRS, REWRITTEN, REWRITTEN_KEY, MANIFEST, LOCK}


def check_apart(opts: RunOptions) -> None:
    """The run folder and the inputs kept apart, before anything is opened: ``--out`` is
    not a data folder nor inside one (the run's files would be read as data by the next
    run), and no input is a file the run writes in ``--out`` (a stage would overwrite it)."""
    out = Path(opts.out).resolve()
    for flag, spec in (("--data", opts.data), ("--eval-data", opts.eval_data)):
        folder = Path(spec).resolve() if spec is not None and Path(spec).is_dir() else None
        if folder is not None and (folder == out or folder in out.parents):
            raise QuantscopeError(f"--out '{opts.out}' is inside the {flag} folder '{spec}': "
                                  "the run's files would be read as data: give an --out "
                                  "outside it")
    _refuse_foreign_files(Path(opts.out))
    for flag, spec in (("MODEL", opts.model), ("--data", opts.data),
                       ("--eval-data", opts.eval_data), ("--tokenizer", opts.tokenizer),
                       ("--hn", opts.hn)):
        path = Path(spec).resolve() if spec is not None and Path(spec).exists() else None
        if path is not None and out in path.parents and _written_here(path.relative_to(out)):
            raise QuantscopeError(f"{flag} '{spec}' is a file the run writes in --out "
                                  f"'{opts.out}': copy it out of the run folder first, or "
                                  "give another --out")


def _refuse_foreign_files(folder: Path) -> None:
    """An existing ``--out`` that is no run folder (no ``run.json``, and no lock file a
    run leaves: a folder whose ``run.json`` was deleted to start afresh is one) holding
    files of the names a stage writes (a hand-written ``plan.json``, another tool's
    ``stats.npz``): refused, not replaced silently."""
    from quantscope.pipeline.manifest import MANIFEST

    if not folder.is_dir() or (folder / MANIFEST).exists() or (folder / LOCK).exists():
        return
    stage_files = {v for k, v in vars(steps).items() if k.isupper() and isinstance(v, str)}
    theirs = sorted(p.name for p in folder.iterdir() if p.name in stage_files and p.is_file())
    if theirs:
        raise QuantscopeError(
            f"--out '{folder}' holds {', '.join(theirs[:3])}{' …' if len(theirs) > 3 else ''}"
            ", which a run writes, and is no run folder (no run.json): the run would "
            "replace them: give a new or empty folder, or move them out")


def _folder(out: str) -> Path:
    """The run folder, created if its parent exists."""
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise QuantscopeError(f"--out '{out}' is a file: give a folder for the run's files")
    if not folder.parent.is_dir():
        raise QuantscopeError(f"--out '{out}': the folder '{folder.parent}' does not exist")
    try:
        folder.mkdir(exist_ok=True)
    except OSError as e:  # e.g. under /proc, or a read-only file system
        raise QuantscopeError(f"--out '{out}': cannot make the run folder ({e.strerror}): "
                              "give a folder you can write to") from None
    return folder


def _remove_stale(folder: Path) -> None:
    """Temporary files a killed run left behind (call holding the folder's lock), also in
    the plan search's evaluation cache."""
    for stale in (*folder.glob(".*.tmp"), *folder.glob(f"{steps.EVALS}/*/.*.tmp"),
                  *folder.glob(".*.tmp.old")):  # a file set's earlier file moved aside
        stale.unlink()  # serde.write_atomic's temporary names


# options absent from a stage's key while off: the keys of earlier runs stay valid
UNKEYED_WHEN_OFF = ("auto_rewrites", "repairs_given", "allow_warnings")


def _key(ctx: Context, manifest: Manifest, name: str, spec: StageSpec) -> str:
    options = {k: getattr(ctx.opts, k) for k in spec.options
               if (k not in UNKEYED_AT_NONE or getattr(ctx.opts, k) is not None)
               and (k not in UNKEYED_WHEN_OFF or getattr(ctx.opts, k))}
    inputs = {"model": ctx.model_digest(), **{f: manifest.digest(f) for f in spec.reads
                                              if (ctx.folder / f).exists()}}
    if spec.data:
        inputs["data"] = str(ctx.data_identity())
    if "hn" in spec.options:
        inputs["hn"] = str(ctx.hn_identity())
    profile = target_file_identity(ctx.opts.target) if "target" in spec.options else None
    if profile is not None:  # a profile file edited under its path (absent for a built-in)
        inputs["target"] = profile
    if spec.rules is not None:  # absent where no rule applies: earlier keys stay valid
        inputs.update(spec.rules(ctx))
    if spec.ranked:  # absent when ORT ranks: the keys of earlier runs stay valid
        ranked_by = _ranked_by(ctx.opts.rank_engine)
        if ranked_by is not None:
            options["rank_engine"] = ranked_by
    return stage_key(name, options, inputs)


def target_file_identity(target: str | None) -> str | None:
    """The content digest of a ``--target`` profile file (None for a built-in name: the
    keys of earlier runs stay valid). A profile edited under the same path (its costs, a
    rule) had left every stage's key unchanged: a rerun skipped them all and reported the
    old plan's cost."""
    from quantscope.pipeline.manifest import file_digest

    if target is None or not (target.endswith(".toml") or "/" in target):
        return None
    return file_digest(target) if Path(target).is_file() else None


def _ranked_by(asked: str) -> str | None:
    """Who ranks the plan search when torch does (its key entry), None when ORT does.
    ``auto`` on a machine without a GPU device is ORT without importing torch (seconds on
    every rerun: :func:`quantscope.finetune.engine.resolve_engine` would import it to ask
    torch.cuda, unless it finds no GPU device file either)."""
    from quantscope.finetune.engine import gpu_device_present, resolve_engine

    if asked == "ort" or (asked == "auto" and not gpu_device_present()):
        return None

    engine = resolve_engine(asked)
    return None if engine.name == "ort" else engine.ranked_by


__all__ = ["RunOptions", "RunResult", "STAGES", "check_apart", "run_pipeline"]
