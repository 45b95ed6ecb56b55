"""``quantscope run`` on a decoder LLM (a prefill/decode pair such as ``smollm2-135m``).

The encoder ``run`` (:mod:`quantscope.pipeline`) for a model that is two graphs sharing one
set of weights. Stages, each writing its files into the run folder, resumable through the
same manifest (``run.json``, :mod:`.manifest`):

==========  =========================================================================
rewrite     the measured recipe of docs/benchmarks.md ("Decoder LLM: the KV prefix
            and the rotation"): the Hadamard rotation of the residual stream
            (``rotate``) and SmoothQuant on each MLP's gated product (calibrated with
            the KV prefix), both FP32-checked per phase: ``model/model.{prefill,
            decode}.onnx`` and the tokenizer (``--rewrites none``: the given graphs)
plan        ``plan --phase`` on those graphs (:func:`quantscope.stages_llm.plan_phases`):
            candidates legal on both phases within ``--max-cost``, measured on a
            quick amount of text, the best kept; ``plan.json`` with the KV prefix
            (``plan.prefix.npz`` / ``.py``), each phase's calibration
evaluate    the chosen plan measured at the amounts of ``check --phase --quality``
            (20,000 predicted tokens, 32 prompts x 64 greedy tokens, 256 decode steps on
            the emulated cache by default), each figure with its standard error: what
            the verdict judges
export      per phase: the float graph the compiler parses (the prefill graph with the
            constant prefix in its cache), the QDQ model (the measured composition) and
            the target's formats (``.alls``, QNN encodings)
host        what the host does: the tokenizer, the prefix, the KV cache layout and each
            phase's quantized inputs and outputs (scale, zero point, snippet)
report      ``verdict.json`` / ``verdict.txt``: the figures, the goal, the costs
==========  =========================================================================

ONNX Runtime ranks and measures every figure (no torch ranking for decoders yet).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantscope.pipeline.manifest import Manifest, file_digest, stage_key
from quantscope.types import QuantscopeError

# --rewrites for a decoder: the recipe measured best on smollm2-135m (benchmarks.md)
AUTO_REWRITES = ("rotate", "smooth")
DECODER_REWRITES = ("rotate", "smooth")  # the names a decoder run takes, in order
MODEL_DIR, REWRITE, PLAN, EVALUATE = "model", "rewrite.json", "plan.json", "evaluate.json"
PLAN_TEXT, HOST, HOST_TEXT, TOKENIZER = "plan.txt", "host.json", "host.md", "tokenizer.json"
VERDICT, VERDICT_TEXT = "verdict.json", "verdict.txt"
W4, W4_PLAN = "w4.json", "plan.w4.json"
STATS = {"prefill": "stats.prefill.npz", "decode": "stats.decode.npz"}
PREFIX_NPZ, PREFIX_PY = "plan.prefix.npz", "plan.prefix.py"
SMOOTH_ALPHA, SMOOTH_SITES = 0.5, "gated"


@dataclass(frozen=True)
class Metric:
    phase: str  # the figure's row in lm_quality's result
    key: str
    higher: bool  # higher is better
    words: str


# --metric for a decoder: the figure the goal is about
METRICS: dict[str, Metric] = {
    "ppl_ratio": Metric("prefill", "ppl_ratio", False, "prefill perplexity ratio to FP32"),
    "top1_agreement": Metric("prefill", "top1_agreement", True,
                             "prefill next-token top-1 agreement with FP32"),
    "decode_top1": Metric("decode_emu_kv", "top1_agreement", True,
                          "decode top-1 agreement with FP32 on the emulated KV cache"),
    "greedy_agreement": Metric("greedy", "greedy_agreement", True,
                               "greedy tokens matching FP32's (matched prefix)"),
}
DEFAULT_METRIC = "ppl_ratio"


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
    rewrites: tuple[str, ...] = AUTO_REWRITES
    prefix: str = "auto"
    tokens: int = 20_000
    prompts: int = 32
    new_tokens: int = 64
    decode_steps: int = 256
    w4: bool = True  # also measure the plan with its a8_w8 weights at a8_w4 (GPTQ)

    def check(self) -> None:
        """The options together, before any file is opened: one line per mistake."""
        from quantscope.targets import load_target

        load_target(self.target)
        if self.metric not in METRICS:
            raise QuantscopeError(f"--metric '{self.metric}' is not a decoder's: use one of "
                                  f"{', '.join(METRICS)}")
        bad = [r for r in self.rewrites if r not in DECODER_REWRITES]
        if bad:
            raise QuantscopeError(f"--rewrites {','.join(bad)} is an encoder rewrite: a decoder "
                                  "run takes auto (rotate, then SmoothQuant on the gated "
                                  "products), rotate, or none")
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
    """A built-in decoder name, or a graph file that reads or writes a KV cache (its
    weights are not read)."""
    import onnx

    from quantscope.model.phases import PAST_PREFIX
    from quantscope.zoo import resolve_model

    try:
        path = Path(resolve_model(str(spec)))
    except QuantscopeError:
        return False
    if ".prefill." in path.name or ".decode." in path.name:
        return True
    if not path.is_file() or path.suffix != ".onnx":
        return False
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # not an ONNX file: the encoder run says so
        return False
    return (any(i.name.startswith(PAST_PREFIX) for i in graph.input)
            or any(o.name.startswith("present.") for o in graph.output))


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

    def spec(self) -> str:
        """The phase graphs the stages after ``rewrite`` work on."""
        if self.opts.rewrites:
            return str(self.path(MODEL_DIR) / "model.prefill.onnx")
        from quantscope.stages_llm import phase_file

        return str(phase_file(self.opts.model, "prefill"))

    def plan(self) -> Any:
        from quantscope.serde import read_plan

        return read_plan(self.path(PLAN))


@dataclass(frozen=True)
class Done:
    files: tuple[str, ...]


def rewrite(ctx: DecoderContext) -> Done:
    """The recipe's rewrites, each on both phase graphs (FP32-checked), one after another;
    intermediate graphs are removed once the next is written."""
    from quantscope.serde import write_json
    from quantscope.stages_llm import LmSetup, rewrite_phase_files, smooth_phase_files
    from quantscope.tasks.lm import DEFAULT_SEQ_LEN

    opts = ctx.opts
    seq = opts.seq_len or DEFAULT_SEQ_LEN
    folder = ctx.path(MODEL_DIR)
    if folder.exists():
        shutil.rmtree(folder)
    if not opts.rewrites:
        write_json(ctx.path(REWRITE), {"rewrites": [], "notes": {}})
        return Done((REWRITE,))
    folder.mkdir()
    spec, notes, made = str(opts.model), {}, []
    for i, name in enumerate(opts.rewrites):
        last = i == len(opts.rewrites) - 1
        out = folder / ("model.prefill.onnx" if last else f"step{i}-{name}.prefill.onnx")
        ctx.say(f"[rewrite] {name} on both phase graphs …")
        if name == "rotate":
            notes[name] = rewrite_phase_files(spec, "rotate", out, seq_len=seq)
        else:  # SmoothQuant on the gated products, calibrated with the KV prefix
            setup = LmSetup(seq_len=seq, calibration=16, evaluation=1, steps=4)
            notes[name] = smooth_phase_files(spec, out, alpha=SMOOTH_ALPHA, setup=setup,
                                             sites=SMOOTH_SITES, prefix=opts.prefix)
        for old in made:  # the previous step's graphs: read, no longer needed
            old.unlink(missing_ok=True)
        made = [p for p in folder.iterdir() if p.name.startswith(f"step{i}-")]
        spec = str(out)
    write_json(ctx.path(REWRITE), {
        "rewrites": list(opts.rewrites), "notes": notes,
        "recipe": "docs/benchmarks.md, 'Decoder LLM: the KV prefix and the rotation': the "
                  "Hadamard rotation of the residual stream, then SmoothQuant (alpha "
                  f"{SMOOTH_ALPHA}) on each MLP's gated product silu(gate) * up"})
    return Done((REWRITE, MODEL_DIR))


def plan(ctx: DecoderContext) -> Done:
    from quantscope.analyze.phases import format_diagnosis
    from quantscope.export.kv_prefix import host_snippet
    from quantscope.serde import (
        bytes_writer,
        plan_writer,
        stats_writer,
        text_writer,
        write_atomic_set,
    )
    from quantscope.stages_llm import format_phase_plan, plan_phases

    opts = ctx.opts
    out = plan_phases(ctx.spec(), opts.target, max_cost=opts.max_cost,
                      setup=opts.rank_setup(), prefix=opts.prefix)
    text = "\n".join([*format_diagnosis(out.diagnosis), *format_phase_plan(out)]) + "\n"
    ctx.say("\n".join(format_phase_plan(out)[-1:]))
    assert out.stats is not None
    items = [(ctx.path(PLAN), plan_writer(out.plan())), (ctx.path(PLAN_TEXT), text_writer(text)),
             *((ctx.path(STATS[p]), stats_writer(s)) for p, s in out.stats.items())]
    files = [PLAN, PLAN_TEXT, *(STATS[p] for p in out.stats)]
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
    result = lm_quality(ctx.spec(), {"plan": plan_}, setup, recorded_prefix(plan_))
    result["seconds"] = round(time.perf_counter() - start, 1)
    write_json(ctx.path(EVALUATE), result)
    return Done((EVALUATE,))


def w4(ctx: DecoderContext) -> Done:
    """The chosen plan with its a8_w8 weights at a8_w4, GPTQ-rounded, checked and measured
    at the evaluate stage's amounts (:func:`quantscope.stages_llm.w4_variant`): decode
    reads every weight per token, so 4-bit weights are what its cost turns on."""
    from quantscope.serde import json_writer, plan_writer, write_atomic_set
    from quantscope.stages_llm import recorded_prefix, w4_variant

    if not ctx.opts.w4:
        ctx.path(W4_PLAN).unlink(missing_ok=True)
        write_atomic_set([(ctx.path(W4), json_writer({"asked": False}))])
        return Done((W4,))
    plan_ = ctx.plan()
    ctx.say("[w4] the plan's a8_w8 weights at a8_w4: checked on both phases, GPTQ, measured …")
    start = time.perf_counter()
    res = w4_variant(ctx.spec(), plan_, ctx.opts.phases_setup(), recorded_prefix(plan_))
    res["seconds"] = round(time.perf_counter() - start, 1)
    plan4 = res.pop("plan")
    write_atomic_set([(ctx.path(W4_PLAN), plan_writer(plan4)),
                      (ctx.path(W4), json_writer({"asked": True, **res}))])
    return Done((W4, W4_PLAN))


def export(ctx: DecoderContext) -> Done:
    """Per phase ``{phase}/``: ``model.onnx`` (float, weights in ``model.onnx.data``: what
    the compiler parses; prefill with the prefix in its cache), ``model.qdq.onnx`` and the
    target's formats, all from the same calibration the figures ran with."""
    import onnx

    from quantscope.export.plan_export import export_plan
    from quantscope.pipeline.steps import ALWAYS, QDQ, formats
    from quantscope.serde import read_stats
    from quantscope.stages_llm import open_phase, recorded_prefix
    from quantscope.tasks.lm_phases import release_memory
    from quantscope.zoo.cache import write_atomic

    plan_ = ctx.plan()
    tokens = recorded_prefix(plan_)
    files = []
    for phase in ("prefill", "decode"):
        sub = ctx.path(phase)
        sub.mkdir(exist_ok=True)
        model = open_phase(ctx.spec(), phase)
        if phase == "prefill" and tokens:
            from quantscope.analyze.prefix import prefixed_model
            from quantscope.zoo.prefix import read_prefix

            model = prefixed_model(model, read_prefix(ctx.path(PREFIX_NPZ)), in_place=True)
        stats = read_stats(ctx.path(STATS[phase]))
        ctx.say(f"[export] {phase}: the QDQ model"
                + "".join(f", {name}" for _, name in formats(ctx.opts.target))
                + ", the float graph …")
        for fmt, name in [(ALWAYS, QDQ), *formats(ctx.opts.target)]:
            export_plan(model, stats, plan_, fmt=fmt, out=sub / name)
            files.append(f"{phase}/{name}")
            release_memory()
        # last: saving with external data moves the weights out of the graph in memory
        write_atomic(sub / "model.onnx", lambda tmp, p=model.proto: onnx.save(
            p, str(tmp), save_as_external_data=True, location="model.onnx.data"))
        files += [f"{phase}/model.onnx", f"{phase}/model.onnx.data"]
        del model
        release_memory()
    return Done(tuple(files))


def host(ctx: DecoderContext) -> Done:
    """The host's steps: the tokenizer, the prefix, the KV cache layout, each phase's
    quantized I/O (:func:`quantscope.export.plan_export.device_io_rows`)."""
    import onnx

    from quantscope.export import device_io as dio
    from quantscope.export.plan_export import device_io_rows
    from quantscope.serde import read_stats, write_json, write_text
    from quantscope.stages_llm import phase_file
    from quantscope.tasks.lm import tokenizer_path
    from quantscope.tasks.lm_phases import release_memory

    plan_ = ctx.plan()
    shutil.copyfile(tokenizer_path(phase_file(ctx.spec(), "prefill")), ctx.path(TOKENIZER))
    prefix = json.loads(dict(plan_.meta).get("kv_prefix") or "null")
    decode = onnx.load(str(ctx.path("decode") / "model.onnx"), load_external_data=False)
    cache = [{"name": i.name, "shape": [d.dim_param or d.dim_value
                                        for d in i.type.tensor_type.shape.dim],
              "dtype": onnx.helper.tensor_dtype_to_np_dtype(
                  i.type.tensor_type.elem_type).name}
             for i in decode.graph.input if i.name.startswith("past.")]
    del decode
    n = len(prefix["tokens"]) if prefix else 0
    seq = ctx.opts.seq_len or ctx.opts.rank_setup().seq_len
    io = {}
    files = [TOKENIZER, HOST, HOST_TEXT]
    for phase in ("prefill", "decode"):
        model = _open_exported(ctx, phase)
        rows = device_io_rows(model, read_stats(ctx.path(STATS[phase])), plan_)
        del model
        release_memory()
        io[phase] = rows
        write_text(ctx.path(phase) / "io_snippet.py", dio.python_snippet(rows))
        files.append(f"{phase}/io_snippet.py")
    doc = {
        "tokenizer": TOKENIZER,
        "prefix": ({"tokens": prefix["tokens"], "text": prefix["text"], "why": prefix["why"],
                    "file": PREFIX_NPZ, "loader": PREFIX_PY} if prefix else None),
        "kv_cache": {"inputs": cache, "prefix_slots": n, "first_prompt_position": n,
                     "compiled_prompt_tokens": seq,
                     "layout": "past.{i}.key / past.{i}.value [batch, kv_heads, positions, "
                               "head_dim] per layer; the decode graph returns present.{i}.* "
                               "with one position more: feed them back as past.{i}.*"},
        "io": io, "io_note": dio.PROVENANCE}
    write_json(ctx.path(HOST), doc)
    write_text(ctx.path(HOST_TEXT), _host_text(doc))
    return Done(tuple(files))


def _open_exported(ctx: DecoderContext, phase: str) -> Any:
    import onnx

    from quantscope.model.load import Model

    path = ctx.path(phase) / "model.onnx"
    return Model(proto=onnx.load(str(path)), source=str(path))


def _host_text(doc: dict[str, Any]) -> str:
    kv = doc["kv_cache"]
    lines = ["# Host steps for the deployed decoder (quantscope run)", "",
             f"1. Tokenize with `{doc['tokenizer']}` (the model's own tokenizer; do not add "
             "special tokens the prefix already holds)."]
    p = doc["prefix"]
    if p:
        lines.append(f"2. Load the constant KV prefix: `{p['loader']}` reads `{p['file']}` "
                     f"(tokens {p['tokens']}: {', '.join(map(repr, p['text']))}; "
                     f"{'; '.join(p['why'])}) into cache slots 0..{kv['prefix_slots'] - 1}. "
                     "These tokens are never run on the device: their FP32 keys and values "
                     "are the cache's first positions, quantized on the way in as every "
                     "past.* input is (the decode graph's input transform below).")
    else:
        lines.append("2. No KV prefix: the prompt starts at cache position 0.")
    lines += [f"3. Prompt positions start at {kv['first_prompt_position']}; the prefill graph "
              f"was compiled for {kv['compiled_prompt_tokens']} prompt tokens; decode then "
              "runs one token per call.",
              f"4. KV cache: {kv['layout']}. Inputs of the decode graph:"]
    lines += [f"   - `{c['name']}` {c['shape']} {c['dtype']}" for c in kv["inputs"]]
    lines.append("5. Quantized inputs and outputs per phase (scale, zero point: "
                 "prefill/io_snippet.py, decode/io_snippet.py):")
    for phase, rows in doc["io"].items():
        for r in rows:
            lines.append(f"   - {phase} {r['role']} `{r['tensor']}`: {r['stored_type']}, scale "
                         f"{r['scale']:.8g}, zero point {r['zero_point']} (real range "
                         f"{r['min']:.6g} .. {r['max']:.6g})")
    lines.append(f"\n{doc['io_note']}")
    return "\n".join(lines) + "\n"


def report(ctx: DecoderContext) -> Done:
    from quantscope.serde import read_json, write_json, write_text

    verdict = decoder_verdict(ctx.opts, read_json(ctx.path(PLAN), "plan"),
                              read_json(ctx.path(EVALUATE), "evaluation"),
                              read_json(ctx.path(REWRITE), "rewrites"),
                              read_json(ctx.path(W4), "a8_w4 variant"))
    write_json(ctx.path(VERDICT), verdict)
    write_text(ctx.path(VERDICT_TEXT), format_decoder_verdict(verdict) + "\n")
    return Done((VERDICT, VERDICT_TEXT))


def decoder_verdict(opts: DecoderOptions, plan_doc: dict[str, Any], evaluation: dict[str, Any],
                    rewrites: dict[str, Any], w4_doc: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
    """The figures the evaluate stage measured, the goal judged on ``opts.metric`` (with its
    standard error: reached, missed, or within the noise), each phase's cost."""
    meta = dict(plan_doc.get("meta") or {})
    results = json.loads(meta.get("phase_results", "{}"))
    res = evaluation["plans"]["plan"]
    figures = {}
    for name, m in METRICS.items():
        row = res[m.phase]
        figures[name] = {"value": row[m.key], "se": row.get(f"{m.key}_se", 0.0),
                         "words": m.words}
    costs = {p: c["cost"] for p, c in results.get("checks", {}).items()}
    errors = sum(c["errors"] for c in results.get("checks", {}).values())
    out: dict[str, Any] = {
        "kind": "decoder", "model": opts.model, "target": opts.target, "metric": opts.metric,
        "goal": opts.goal, "max_cost": opts.max_cost, "rewrites": rewrites.get("rewrites", []),
        "candidate": meta.get("candidate"), "costs": costs, "errors": errors,
        "overrides": sum(1 for v in (plan_doc.get("groups") or {}).values()
                         if v != plan_doc.get("default")),
        "prefix": json.loads(meta["kv_prefix"]) if meta.get("kv_prefix") else None,
        "figures": figures, "data": evaluation["data"], "setup": evaluation["setup"],
        "ranked_by": "onnxruntime (the plan stage, on " + _amounts(json.loads(
            meta.get("lm_setup") or "{}")) + ")",
        "measured_by": "onnxruntime", "seconds": evaluation.get("seconds")}
    if opts.goal is not None:
        f = figures[opts.metric]
        sign = 1 if METRICS[opts.metric].higher else -1
        margin = sign * (f["value"] - opts.goal)
        met = margin >= 0
        within = abs(margin) <= 2 * f["se"]
        out["goal_met"] = met
        out["goal_text"] = (
            f"{'reached' if met else 'missed'}: {opts.metric} {f['value']:.4g} "
            f"(± {f['se']:.2g}) against the goal {opts.goal:g}"
            + (" (within 2 standard errors: not decided by this amount of text)" if within
               else ""))
    out["w4"] = _w4_summary(w4_doc or {"asked": False})
    over = {p: c for p, c in costs.items() if c > opts.max_cost + 1e-9}
    out["cost_text"] = ", ".join(f"{p} {c:.2f}x" for p, c in costs.items()) + (
        f" (over the cap {opts.max_cost:g}x: {', '.join(over)})" if over
        else f" (within {opts.max_cost:g}x)")
    return out


def _w4_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """The a8_w4 variant's checks and figures (``w4.json``) for the verdict."""
    if not doc.get("asked"):
        return {"asked": False}
    out = {"asked": True, "layers": doc["layers"], "measured": doc["measured"],
           "checks": doc["checks"]}
    if doc["measured"]:
        q = doc["quality"]
        out["figures"] = {name: {"value": q[m.phase][m.key],
                                 "se": q[m.phase].get(f"{m.key}_se", 0.0)}
                          for name, m in METRICS.items()}
        out["gptq"] = doc["gptq"]["effect"]
    return out


def _amounts(s: dict[str, Any]) -> str:
    """An :class:`~quantscope.stages_llm.LmSetup`'s amounts of text, in words."""
    if not s:
        return "?"
    steps = s["steps"] * (s.get("decode_windows") or s["evaluation"])
    return (f"{s['evaluation']} windows of {s['seq_len']} tokens, {s['prompts']} prompts x "
            f"{s['new_tokens']} greedy tokens, {steps} decode steps")


def format_decoder_verdict(v: dict[str, Any]) -> str:
    s = v["setup"]
    lines = [f"verdict: {v['model']} on {v['target']} (decoder: prefill and decode graphs)",
             f"  plan: {v['candidate']} ({v['overrides']} groups at 16 bit), cost "
             f"{v['cost_text']}, {v['errors']} legality error(s) on the two phases",
             "  rewrites: " + (", ".join(v["rewrites"]) or "none")]
    p = v["prefix"]
    lines.append("  KV prefix: " + (f"tokens {p['tokens']} ({', '.join(map(repr, p['text']))})"
                                    " in FP32 in the cache" if p else "none"))
    lines.append(f"  measured held out on {v['data']}: {_amounts(s)}:")
    for name, f in v["figures"].items():
        lines.append(f"    {name:<17} {f['value']:>8.4f} (± {f['se']:.4f})  {f['words']}")
    if v.get("goal_text"):
        lines.append(f"  goal: {v['goal_text']}")
    lines += _w4_lines(v.get("w4") or {"asked": False})
    lines.append(f"  ranked by {v['ranked_by']}; measured by {v['measured_by']}")
    return "\n".join(lines)


def _w4_lines(w: dict[str, Any]) -> list[str]:
    if not w["asked"]:
        return ["  a8_w4 weights: not asked (--w4 off)"]
    c = w["checks"]
    head = (f"  the same plan with its {w['layers']} a8_w8 weighted layers at a8_w4 (GPTQ): "
            f"cost prefill {c['w4.prefill']['cost']:.2f}x, decode {c['w4.decode']['cost']:.2f}x; "
            f"decode weights {c['w4.decode']['weight_mb']:.4g} MB "
            f"(8-bit weights: {c['w8.decode']['weight_mb']:.4g} MB)")
    if not w["measured"]:
        rules = sorted({r for k, x in c.items() if k.startswith("w4.") for r in x["rules"]})
        return [head, "    not legal on the target (" + (", ".join(rules) or "no layer to "
                                                          "take") + "): not measured"]
    return [head, "    measured: " + ", ".join(
        f"{name} {f['value']:.4f} (± {f['se']:.4f})" for name, f in w["figures"].items())]


@dataclass(frozen=True)
class DecoderStage:
    run: Callable[[DecoderContext], Done]
    reads: tuple[str, ...]
    options: tuple[str, ...]


DECODER_STAGES: dict[str, DecoderStage] = {
    "rewrite": DecoderStage(rewrite, (), ("rewrites", "seq_len", "prefix")),
    "plan": DecoderStage(plan, (REWRITE,), ("target", "max_cost", "seq_len", "prefix")),
    "evaluate": DecoderStage(evaluate, (REWRITE, PLAN),
                             ("seq_len", "tokens", "prompts", "new_tokens", "decode_steps")),
    "w4": DecoderStage(w4, (REWRITE, PLAN), ("w4", "seq_len", "tokens", "prompts",
                                              "new_tokens", "decode_steps")),
    "export": DecoderStage(export, (REWRITE, PLAN, *STATS.values()), ("target",)),
    "host": DecoderStage(host, (PLAN, *STATS.values()), ("seq_len",)),
    "report": DecoderStage(report, (PLAN, EVALUATE, REWRITE, W4),
                           ("goal", "metric", "max_cost", "target", "model")),
}


def _graph_digest(path: Path) -> str:
    """A graph file's digest with its external weights' (``X.onnx.data``), if any."""
    data = path.with_name(f"{path.name}.data")
    return file_digest(path) + (file_digest(data) if data.is_file() else "")


@dataclass(frozen=True)
class DecoderRunResult:
    folder: Path
    ran: tuple[str, ...]
    skipped: tuple[str, ...]
    verdict: dict[str, Any]


def run_decoder(opts: DecoderOptions, *, force: str | None = None,
                progress: bool = True) -> DecoderRunResult:
    """Every stage not yet done on these inputs (``force``: rerun from that stage)."""
    from quantscope.analyze.memory import peak_bytes, release_memory, reset_peak
    from quantscope.pipeline import _check_out, _folder, _lock, _remove_stale
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
    model_digest = "".join(_graph_digest(phase_file(opts.model, p)) for p in ("prefill", "decode"))
    with _lock(folder):
        _remove_stale(folder)
        manifest = Manifest(folder)
        if force is not None:
            manifest.forget(list(DECODER_STAGES)[list(DECODER_STAGES).index(force):])
        ran, skipped = [], []
        for name, spec in DECODER_STAGES.items():
            key = stage_key(f"decoder.{name}",
                            {k: getattr(opts, k) for k in spec.options},
                            {"model": model_digest,
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
            done = spec.run(ctx)
            manifest.record(name, key, done.files, time.perf_counter() - start,
                            peak=peak_bytes())
            ran.append(name)
    return DecoderRunResult(folder, tuple(ran), tuple(skipped),
                            read_json(folder / VERDICT, "verdict"))


__all__ = ["AUTO_REWRITES", "DECODER_STAGES", "DecoderOptions", "DecoderRunResult", "METRICS",
           "decoder_verdict", "format_decoder_verdict", "is_decoder", "run_decoder"]
