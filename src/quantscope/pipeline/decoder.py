"""``quantscope run`` on a decoder LLM (a prefill/decode pair such as ``smollm2-135m``).

The encoder ``run`` (:mod:`quantscope.pipeline`) for a model that is two graphs sharing one
set of weights. Stages, each writing its files into the run folder, resumable through the
same manifest (``run.json``, :mod:`.manifest`):

==========  =========================================================================
rewrite     the steps measured best on smollm2-135m (docs/benchmarks.md, "``--rewrites
            search``"; ``stages_llm.DEFAULT_STEPS``): the prefill MLPs in token chunks
            (``gatedsplit``), so each gated product is legal at 16 bit; each step a
            rewrite registry entry, FP32-checked per phase: ``model/model.{prefill,
            decode}.onnx`` and the tokenizer (``--rewrites none``: the given graphs; a
            comma list of the recipe's steps, ``rotate`` (Hadamard R1), ``vrotate`` (R2),
            ``smooth`` (SmoothQuant on the gated products), ``gatedsplit``; ``search``:
            the steps but vrotate chosen by measurement, :mod:`.decoder_search`)
plan        ``plan --phase`` on those graphs (:func:`quantscope.stages_llm.plan_phases`):
            candidates legal on both phases within ``--max-cost``, measured on a
            quick amount of text, the best kept; ``plan.json`` with the KV prefix
            (``plan.prefix.npz`` / ``.py``), each phase's calibration
evaluate    the chosen plan measured at the amounts of ``check --phase --quality``
            (20,000 predicted tokens, 32 prompts x 64 greedy tokens, 256 decode steps on
            the emulated cache by default), each figure with its standard error: what
            the verdict judges
finetune    ``--finetune on``: the weights both graphs share trained under the plan
            (PyTorch), measured again, kept when better (:mod:`.decoder_finetune`);
            kept, the stages after it ship the tuned graphs (``model.tuned/``)
w4, whatif  the plan with its a8_w8 weights at a8_w4 (GPTQ); ``--whatif``: the plan's
            classes lifted, each measured and checked
export      per phase: the float graph the compiler parses (the prefill graph with the
            constant prefix in its cache), the QDQ model (the measured composition) and
            the target's formats (``.alls``, QNN encodings)
host        what the host does: the tokenizer, the prefix, the KV cache layout and each
            phase's quantized inputs and outputs (scale, zero point, snippet)
report      ``verdict.json`` / ``verdict.txt``: the figures, the goal, the costs
==========  =========================================================================

ONNX Runtime ranks and measures every figure (no torch ranking for decoders yet); PyTorch
only trains (``--finetune``).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantscope.emulate.release import release_memory
from quantscope.pipeline.decoder_files import (
    CANDIDATES,
    EVALUATE,
    FINETUNE,
    HOST,
    HOST_TEXT,
    MODEL_DIR,
    PHASE_ALLS,
    PLAN,
    PLAN_TEXT,
    PREFIX_NPZ,
    PREFIX_PY,
    REPORT,
    REWRITE,
    STATS,
    VERDICT,
    VERDICT_TEXT,
    W4,
    W4_PLAN,
    WHATIF,
    Done,
)
from quantscope.pipeline.decoder_finetune import finetune, shipped
from quantscope.pipeline.decoder_report import (
    DEFAULT_METRIC,
    METRICS,
    decoder_verdict,
    format_decoder_verdict,
    phase_export_warnings,
    whatif_summary,
)
from quantscope.pipeline.decoder_ship import export, host
from quantscope.pipeline.manifest import Manifest, model_file_digest, stage_key
from quantscope.types import QuantscopeError

MAX_RATIO = 3.0  # a perplexity ratio goal above it is taken for dB or a percentage


@dataclass(frozen=True)
class DecoderOptions:
    """What a decoder ``run`` was asked (the keys of its stages are made of these)."""

    model: str
    target: str
    out: str
    goal: float | None = None
    metric: str = DEFAULT_METRIC
    max_cost: float = 1.5
    seq_len: int | None = None  # None: the decoder default (64)
    # None: the steps measured best on smollm2-135m (stages_llm.DEFAULT_STEPS: gatedsplit),
    # or with ``search`` the whole recipe the search starts from (stages_llm.RECIPE)
    rewrites: tuple[str, ...] | None = None
    search: bool = False  # --rewrites search: the recipe's steps chosen by measurement
    prefix: str = "auto"
    tokens: int = 20_000
    prompts: int = 32
    new_tokens: int = 64
    decode_steps: int = 256
    w4: bool = True  # also measure the plan with its a8_w8 weights at a8_w4 (GPTQ)
    # --phase-hn: (phase, parsed HN file) pairs, each phase's exact Hailo layer names for
    # its .alls (None: guessed by op order; absent from the export stage's key)
    hn: tuple[tuple[str, str], ...] | None = None
    whatif: bool = False  # --whatif: the plan's classes lifted, measured and checked
    # --finetune on: the fine-tune's time budget in seconds (--budget); None: not asked
    # (absent from the finetune stage's key)
    finetune: float | None = None
    # --allow-warning: warning rule ids (or "all") the plan accepts, as given, sorted (None:
    # none given, absent from the plan stage's key)
    allow_warnings: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.rewrites is None:
            from quantscope.pipeline.decoder_search import searched
            from quantscope.stages_llm import DEFAULT_STEPS, RECIPE

            object.__setattr__(self, "rewrites",
                               searched(RECIPE) if self.search else DEFAULT_STEPS)

    def check(self) -> None:
        """The options together, before any file is opened: one line per mistake."""
        from quantscope.serde import read_json
        from quantscope.stages_llm import RECIPE

        self.allowed()  # loads the target; an error rule or unknown id: refused in one line
        if self.finetune is not None and not self.finetune > 0:
            raise QuantscopeError("--finetune on needs a time budget: give --budget, e.g. "
                                  "--budget 30m")
        self.phases_setup()  # amounts the built-in text cannot give: refused now
        if self.metric not in METRICS:
            raise QuantscopeError(f"--metric '{self.metric}' is not a decoder's: use one of "
                                  f"{', '.join(METRICS)}")
        bad = [r for r in self.rewrites or () if r not in RECIPE]
        if bad:
            raise QuantscopeError(f"--rewrites {','.join(bad)} is an encoder "
                                  "rewrite: a decoder run takes auto (the prefill MLPs in "
                                  "token chunks, so their gated products are 16 bit), a "
                                  f"comma list of {', '.join(RECIPE)}, none, or "
                                  "search (those steps chosen by measurement)")
        for phase, path in self.hn or ():
            if phase not in ("prefill", "decode"):
                raise QuantscopeError(f"--phase-hn {phase}=...: the phases are prefill and "
                                      "decode: give --phase-hn prefill=P.hn and/or "
                                      "--phase-hn decode=D.hn")
            doc = read_json(path, f"{phase} HN")
            if not isinstance(doc, dict) or not isinstance(doc.get("layers"), dict):
                raise QuantscopeError(f"--phase-hn {phase}={path} has no 'layers' table: "
                                      f"pass the .hn JSON the Dataflow Compiler parsed from "
                                      f"the run's {phase}/model.onnx")
        if self.goal is None:
            return
        m = METRICS[self.metric]
        if m.higher and not 0 < self.goal <= 1:
            raise QuantscopeError(f"--goal {self.goal:g} is no fraction for --metric "
                                  f"{self.metric} ({m.words}): give one in (0, 1], e.g. 0.9")
        if not m.higher and not self.goal >= 1:
            raise QuantscopeError(
                f"--goal {self.goal:g} for --metric {self.metric} ({m.words}) asks for a "
                "perplexity below FP32's: give a ratio >= 1 (e.g. 1.05), or --metric "
                "top1_agreement for an agreement fraction")
        if not m.higher and self.goal > MAX_RATIO:  # dB or a percentage, not a ratio
            raise QuantscopeError(
                f"--goal {self.goal:g} for --metric {self.metric} ({m.words}) accepts a "
                f"perplexity {self.goal:g}x FP32's, which a broken model reaches: give a ratio "
                f"from 1 to {MAX_RATIO:g} (e.g. 1.05; not dB or percent), or --metric "
                "top1_agreement for an agreement fraction")

    @property
    def rewrite_search(self) -> dict[str, Any] | None:
        """What a searched recipe is a function of besides the rewrite stage's other
        options (None, absent from the key, when not searching)."""
        if not self.search:
            return None
        from quantscope.pipeline.decoder_search import KEEP_RULE

        return {"metric": self.metric, "max_cost": self.max_cost, "keep_rule": KEEP_RULE,
                "setup": self.rank_setup().__dict__,
                **({"allow_warnings": self.allow_warnings} if self.allow_warnings else {})}

    @property
    def rewrite_accepts(self) -> list[str] | None:
        """The accepted warning rules a step of the recipe answers (gatedsplit: the size
        rule), which change what it does (:func:`quantscope.stages_llm.recipe_accepts`);
        None, absent from the rewrite stage's key, when none: a folder made without
        ``--allow-warning``, or accepting only other rules, resumes."""
        from quantscope.stages_llm import recipe_accepts

        return recipe_accepts(tuple(self.rewrites or ()), self.allowed()) or None

    def allowed(self) -> frozenset[str]:
        """``--allow-warning`` resolved on the target (:mod:`quantscope.targets.accept`)."""
        from quantscope.targets import load_target
        from quantscope.targets.accept import allowed_warnings

        return allowed_warnings(load_target(self.target), self.allow_warnings or ())

    def phases_setup(self) -> Any:
        from quantscope.stages_llm import LmSetup

        return LmSetup.at(self.seq_len, tokens=self.tokens, prompts=self.prompts,
                          new_tokens=self.new_tokens, decode_steps=self.decode_steps)

    def rank_setup(self) -> Any:
        """The plan stage's quick amounts (the candidates' ranking; the evaluate stage
        measures the chosen one at :meth:`phases_setup`'s)."""
        from quantscope.stages_llm import LmSetup
        from quantscope.tasks.lm import DEFAULT_SEQ_LEN

        return LmSetup(seq_len=self.seq_len or DEFAULT_SEQ_LEN)


def is_decoder(spec: str) -> bool:
    """A built-in decoder name, or a phase graph file (``X.prefill.onnx`` / ``X.decode.onnx``,
    as :func:`quantscope.model.phases.phase_path` finds it); nothing is loaded."""
    from quantscope.zoo import resolve_model

    try:
        path = Path(resolve_model(str(spec)))
    except QuantscopeError:
        return False
    return ".prefill." in path.name or ".decode." in path.name


@dataclass
class DecoderContext:
    opts: DecoderOptions
    folder: Path
    progress: bool = True

    def path(self, name: str) -> Path:
        return self.folder / name

    def say(self, text: str) -> None:
        from quantscope.progress import say

        say(text, show=self.progress)

    def chosen_rewrites(self) -> tuple[str, ...]:
        """The steps the rewrite stage applied (``rewrite.json``: the named ones, or what
        ``--rewrites search`` chose)."""
        from quantscope.serde import read_json

        return tuple(read_json(self.path(REWRITE), "rewrites")["rewrites"])

    def spec(self) -> str:
        """The phase graphs the stages after ``rewrite`` work on."""
        if self.chosen_rewrites():
            return str(self.path(MODEL_DIR) / "model.prefill.onnx")
        from quantscope.stages_llm import phase_file

        return str(phase_file(self.opts.model, "prefill"))

    def plan(self) -> Any:
        from quantscope.serde import read_plan

        return read_plan(self.path(PLAN))

    def stats(self, files: dict[str, str] | None = None) -> dict[str, Any]:
        """The plan stage's calibration per phase (with the plan's KV prefix), or that of
        ``files`` (the fine-tune's): the calibration windows of every later stage's
        amounts are the same 16."""
        from quantscope.serde import read_stats

        return {p: read_stats(self.path(f)) for p, f in (files or STATS).items()}


def rewrite(ctx: DecoderContext) -> Done:
    """The recipe's rewrites (:func:`quantscope.stages_llm.recipe_phase_files`), or with
    ``--rewrites search`` the steps chosen by measurement (:mod:`.decoder_search`)."""
    from quantscope.rewrites.registry import REWRITES
    from quantscope.serde import write_json
    from quantscope.stages_llm import recipe_phase_files

    opts = ctx.opts
    from quantscope.pipeline.decoder_search import TRIALS, search_recipe

    folder = ctx.path(MODEL_DIR)
    for old in (folder, ctx.path(TRIALS)):  # TRIALS: a search cut short left them
        if old.exists():
            shutil.rmtree(old)
    search = None
    if opts.search:

        record, kept, notes = search_recipe(
            opts.model, ctx.folder, target=opts.target, metric=opts.metric,
            max_cost=opts.max_cost, seq_len=opts.seq_len, prefix=opts.prefix,
            setup=opts.rank_setup(), say=ctx.say, allowed=opts.allowed())
        if kept is not None:
            shutil.move(str(kept.parent), str(folder))
        shutil.rmtree(ctx.path(TRIALS), ignore_errors=True)
        steps, search = record.chosen, record.to_dict()
        ctx.say(f"[rewrite] search chose: {', '.join(steps) or 'no step'}")
    elif opts.rewrites:
        steps = tuple(opts.rewrites)
        folder.mkdir()
        notes = recipe_phase_files(opts.model, steps, folder / "model.prefill.onnx",
                                   seq_len=opts.seq_len, prefix=opts.prefix, say=ctx.say,
                                   target=opts.target, allowed=opts.allowed())
    else:
        steps, notes = (), {}
    doc: dict[str, Any] = {"rewrites": list(steps), "notes": notes}
    if steps:
        doc["recipe"] = ("docs/benchmarks.md, 'Decoder LLM' and '--rewrites search' (the "
                         "steps measured on smollm2-135m): "
                         + ", then ".join(REWRITES[n].what for n in steps)
                         + (f" (SmoothQuant's alpha {REWRITES['smooth'].config().alpha})"
                            if "smooth" in steps else ""))
    if search is not None:
        doc["search"] = search
    write_json(ctx.path(REWRITE), doc)
    return Done((REWRITE, MODEL_DIR) if steps else (REWRITE,))


def plan(ctx: DecoderContext) -> Done:
    from quantscope.analyze.phases import format_diagnosis
    from quantscope.export.kv_prefix import host_snippet
    from quantscope.pipeline.decoder_report import candidates_doc
    from quantscope.serde import (
        bytes_writer,
        json_writer,
        plan_writer,
        stats_writer,
        text_writer,
        write_atomic_set,
    )
    from quantscope.stages_llm import format_phase_plan, plan_phases

    opts = ctx.opts
    out = plan_phases(ctx.spec(), opts.target, max_cost=opts.max_cost,
                      setup=opts.rank_setup(), prefix=opts.prefix, allowed=opts.allowed())
    text = "\n".join([*format_diagnosis(out.diagnosis), *format_phase_plan(out)]) + "\n"
    ctx.say("\n".join(ln for ln in format_phase_plan(out) if ln.startswith(("chosen:",
                                                                            "accepted by"))))
    assert out.stats is not None
    items = [(ctx.path(PLAN), plan_writer(out.plan())), (ctx.path(PLAN_TEXT), text_writer(text)),
             (ctx.path(CANDIDATES), json_writer(candidates_doc(out))),
             *((ctx.path(STATS[p]), stats_writer(s)) for p, s in out.stats.items())]
    files = [PLAN, PLAN_TEXT, CANDIDATES, *(STATS[p] for p in out.stats)]
    if out.prefix is not None:
        rec = out.prefix.to_dict()
        items += [(ctx.path(PREFIX_NPZ), bytes_writer(out.prefix.kv.to_bytes())),
                  (ctx.path(PREFIX_PY), text_writer(host_snippet(ctx.path(PLAN), rec["tokens"],
                                                                 rec["text"])))]
        files += [PREFIX_NPZ, PREFIX_PY]
    else:
        for stale in (PREFIX_NPZ, PREFIX_PY):
            ctx.path(stale).unlink(missing_ok=True)
    write_atomic_set(items)
    return Done(tuple(files))


def evaluate(ctx: DecoderContext) -> Done:
    from quantscope.serde import write_json
    from quantscope.stages_llm import lm_quality, recorded_prefix

    plan_ = ctx.plan()
    setup = ctx.opts.phases_setup()
    ctx.say(f"[evaluate] the chosen plan on {setup.evaluation} windows of {setup.seq_len} "
            f"tokens, {setup.prompts} prompts x {setup.new_tokens} greedy tokens, "
            f"{setup.steps * (setup.decode_windows or setup.evaluation)} decode steps …")
    start = time.perf_counter()
    result = lm_quality(ctx.spec(), {"plan": plan_}, setup, recorded_prefix(plan_),
                        stats=ctx.stats())
    result["seconds"] = round(time.perf_counter() - start, 1)
    write_json(ctx.path(EVALUATE), result)
    return Done((EVALUATE,))


def w4(ctx: DecoderContext) -> Done:
    """The chosen plan with its a8_w8 weights at a8_w4, GPTQ-rounded, checked and measured
    at the evaluate stage's amounts (:func:`quantscope.stages_llm_w4.w4_variant`): decode
    reads every weight per token, so 4-bit weights are what its cost turns on."""
    from quantscope.serde import json_writer, plan_writer, write_atomic_set
    from quantscope.stages_llm import recorded_prefix
    from quantscope.stages_llm_w4 import w4_variant

    if not ctx.opts.w4:
        ctx.path(W4_PLAN).unlink(missing_ok=True)
        write_atomic_set([(ctx.path(W4), json_writer({"asked": False}))])
        return Done((W4,))
    plan_, ship = ctx.plan(), shipped(ctx)
    ctx.say("[w4] the plan's a8_w8 weights at a8_w4: checked on both phases, GPTQ, measured …")
    start = time.perf_counter()
    res = w4_variant(ctx.spec(), plan_, ctx.opts.phases_setup(), recorded_prefix(plan_),
                     stats=ctx.stats(ship.stats), allowed=ctx.opts.allowed(),
                     emulated_spec=ship.spec if ship.tuned else None)
    res["seconds"] = round(time.perf_counter() - start, 1)
    plan4 = res.pop("plan")
    write_atomic_set([(ctx.path(W4_PLAN), plan_writer(plan4)),
                      (ctx.path(W4), json_writer({"asked": True, **res}))])
    return Done((W4, W4_PLAN))


def whatif(ctx: DecoderContext) -> Done:
    """``--whatif``: the plan's variants measured and checked (:mod:`.decoder_whatif`);
    without it the plan as its phase scripts carry it, where they leave a decision NOT
    SET (else ``{"asked": false}``)."""
    from quantscope.pipeline.decoder_whatif import measure_whatif
    from quantscope.serde import json_writer, read_json, write_atomic_set

    hn = {p: read_json(f, "HN") for p, f in ctx.opts.hn or ()}
    ship = shipped(ctx)
    doc = measure_whatif(ctx.spec(), ctx.plan(), ctx.stats(ship.stats), ctx.opts.phases_setup(),
                         target=ctx.opts.target, max_cost=ctx.opts.max_cost, hn=hn,
                         asked=ctx.opts.whatif, say=ctx.say, allowed=ctx.opts.allowed(),
                         emulated_spec=ship.spec if ship.tuned else None)
    write_atomic_set([(ctx.path(WHATIF), json_writer(doc))])
    return Done((WHATIF,))


def report(ctx: DecoderContext) -> Done:
    from quantscope.report.decoder import decoder_report_html
    from quantscope.serde import read_json, write_json, write_text

    verdict = decoder_verdict(ctx.opts, read_json(ctx.path(PLAN), "plan"),
                              read_json(ctx.path(EVALUATE), "evaluation"),
                              read_json(ctx.path(REWRITE), "rewrites"),
                              read_json(ctx.path(W4), "a8_w4 variant"),
                              read_json(ctx.path(FINETUNE), "fine-tune"))
    verdict.update(phase_export_warnings(ctx.folder, PHASE_ALLS))
    if ctx.path(WHATIF).is_file():
        verdict["whatif"] = whatif_summary(read_json(ctx.path(WHATIF), "whatif"), ctx.opts)
    text = format_decoder_verdict(verdict)
    write_json(ctx.path(VERDICT), verdict)
    write_text(ctx.path(VERDICT_TEXT), text + "\n")
    write_text(ctx.path(REPORT), decoder_report_html(
        text, verdict, read_json(ctx.path(CANDIDATES), "candidates")
        if ctx.path(CANDIDATES).is_file() else None,
        ctx.path(PLAN_TEXT).read_text(encoding="utf-8"),
        read_json(ctx.path(HOST), "host steps"), ctx.path(HOST_TEXT).read_text(encoding="utf-8")))
    return Done((VERDICT, VERDICT_TEXT, REPORT))


# options absent from a stage's key while None: the keys of earlier runs stay valid
UNKEYED_WHEN_NONE = ("rewrite_search", "hn", "allow_warnings", "rewrite_accepts", "finetune")


@dataclass(frozen=True)
class DecoderStage:
    run: Callable[[DecoderContext], Done]
    reads: tuple[str, ...]
    options: tuple[str, ...]


DECODER_STAGES: dict[str, DecoderStage] = {
    "rewrite": DecoderStage(rewrite, (), ("rewrites", "seq_len", "prefix", "target",
                                          "rewrite_search", "rewrite_accepts")),
    "plan": DecoderStage(plan, (REWRITE,), ("target", "max_cost", "seq_len", "prefix",
                                            "allow_warnings")),
    "evaluate": DecoderStage(evaluate, (REWRITE, PLAN, *STATS.values()),
                             ("seq_len", "tokens", "prompts", "new_tokens", "decode_steps")),
    "finetune": DecoderStage(finetune, (REWRITE, PLAN, *STATS.values(), EVALUATE),
                             ("finetune", "seq_len", "tokens", "prompts", "new_tokens",
                              "decode_steps", "metric")),
    "w4": DecoderStage(w4, (REWRITE, PLAN, *STATS.values(), FINETUNE),
                       ("w4", "seq_len", "tokens", "prompts", "new_tokens", "decode_steps",
                        "allow_warnings")),
    "whatif": DecoderStage(whatif, (REWRITE, PLAN, *STATS.values(), FINETUNE),
                           ("whatif", "seq_len", "decode_steps", "target", "max_cost",
                            "hn", "allow_warnings")),
    "export": DecoderStage(export, (REWRITE, PLAN, *STATS.values(), FINETUNE), ("target", "hn")),
    "host": DecoderStage(host, (PLAN, *STATS.values(), FINETUNE), ("seq_len",)),
    "report": DecoderStage(report, (PLAN, EVALUATE, REWRITE, W4, CANDIDATES, PLAN_TEXT, HOST,
                                    HOST_TEXT, WHATIF, FINETUNE, *PHASE_ALLS),
                           ("goal", "metric", "max_cost", "target", "model")),
}


def stage_options(spec: DecoderStage, opts: DecoderOptions) -> dict[str, Any]:
    """The options a stage's key holds (one of :data:`UNKEYED_WHEN_NONE` only when set)."""
    return {k: getattr(opts, k) for k in spec.options
            if k not in UNKEYED_WHEN_NONE or getattr(opts, k) is not None}


def phases_digest(model: str | Path) -> str:
    """The digest of a decoder's two graph files, each with every external data file its
    tensors name: new weights under unchanged graphs are a new model for the resume."""
    from quantscope.stages_llm import phase_file

    return "".join(model_file_digest(phase_file(model, p)) for p in ("prefill", "decode"))


def run_decoder(opts: DecoderOptions, *, force: str | None = None,
                progress: bool = True) -> Any:
    """Every stage not yet done on these inputs (``force``: rerun from it): a RunResult."""
    from quantscope.analyze.memory import peak_bytes, reset_peak
    from quantscope.pipeline import RunResult, _check_out, _folder, _lock, _remove_stale
    from quantscope.pipeline import target_file_identity as profile_of
    from quantscope.serde import read_json
    from quantscope.stages_llm import phase_file

    opts.check()
    if force is not None and force not in DECODER_STAGES:
        raise QuantscopeError(f"--force {force}: a decoder run's stages are "
                              f"{', '.join(DECODER_STAGES)}")
    phase_file(opts.model, "decode")  # both graphs exist before the folder does
    _check_out(opts.out)
    folder = _folder(opts.out)
    ctx = DecoderContext(opts, folder, progress)
    model_digest, profile = phases_digest(opts.model), profile_of(opts.target)
    with _lock(folder):
        _remove_stale(folder)
        manifest = Manifest(folder, say=ctx.say)  # a stage left unfinished: said
        if force is not None:
            manifest.forget(list(DECODER_STAGES)[list(DECODER_STAGES).index(force):])
        ran, skipped = [], []
        for name, spec in DECODER_STAGES.items():
            key = stage_key(f"decoder.{name}", stage_options(spec, opts),
                            {"model": model_digest, **({"target": profile} if profile and
                                                       "target" in spec.options else {}),
                             **{f: manifest.digest(f) for f in spec.reads
                                if (folder / f).exists()}})
            if manifest.done(name, key):
                skipped.append(name)
                ctx.say(f"[{name}] done already (same inputs): skipped")
                continue
            ctx.say(f"[{name}] …")
            release_memory()
            reset_peak()
            start = time.perf_counter()
            done = manifest.run(name, spec.run, ctx)
            manifest.record(name, key, done.files, time.perf_counter() - start,
                            peak=peak_bytes())
            ran.append(name)
    return RunResult(folder, tuple(ran), tuple(skipped), read_json(folder / VERDICT, "verdict"))


__all__ = ["DECODER_STAGES", "DecoderOptions", "METRICS",
           "decoder_verdict", "format_decoder_verdict", "is_decoder", "run_decoder"]
