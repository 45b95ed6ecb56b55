"""What a decoder ``run`` ships (:mod:`.decoder`): the ``export`` stage (per phase the float
graph the compiler parses, the QDQ model and the target's formats) and the ``host`` stage
(tokenizer, KV prefix, cache layout, each phase's quantized I/O), both from the graphs,
calibration and prefix :func:`.decoder_finetune.shipped` names (a kept fine-tune's, else
the plan stage's)."""

from __future__ import annotations

import shutil
from typing import Any

from quantscope.emulate.release import release_memory
from quantscope.pipeline.decoder_files import HOST, HOST_TEXT, TOKENIZER, Done
from quantscope.pipeline.decoder_finetune import shipped
from quantscope.pipeline.decoder_report import host_text


def export(ctx: Any) -> Done:
    """Per phase ``{phase}/``: ``model.onnx`` (float, weights in ``model.onnx.data``: what
    the compiler parses; prefill with the prefix in its cache), ``model.qdq.onnx`` and the
    target's formats, all from the same calibration the figures ran with."""
    import onnx

    from quantscope.pipeline.steps import ALWAYS, QDQ, export_file, formats
    from quantscope.plan.accepted import phase_plan
    from quantscope.serde import read_json, read_stats
    from quantscope.stages_llm import open_phase, recorded_prefix
    from quantscope.zoo.cache import write_atomic

    plan_, files, ship = ctx.plan(), [], shipped(ctx)
    tokens = recorded_prefix(plan_)
    for phase in ("prefill", "decode"):
        sub = ctx.path(phase)
        sub.mkdir(exist_ok=True)
        model = open_phase(ship.spec, phase)
        if phase == "prefill" and tokens:
            from quantscope.analyze.prefix import prefixed_model
            from quantscope.zoo.prefix import read_prefix

            model = prefixed_model(model, read_prefix(ctx.path(ship.prefix_npz)), in_place=True)
        stats = read_stats(ctx.path(ship.stats[phase]))
        ctx.say(f"[export] {phase}: the QDQ model"
                + "".join(f", {name}" for _, name in formats(ctx.opts.target))
                + ", the float graph …")
        hn = dict(ctx.opts.hn or ()).get(phase)
        for fmt, name in [(ALWAYS, QDQ), *formats(ctx.opts.target)]:
            export_file(model, stats, phase_plan(plan_, phase), fmt, sub / name,  # + its warning
                        hn=read_json(hn, "HN") if hn else None, label=f"{phase}/{name}",
                        say=lambda text, p=phase: ctx.say(f"[export] {p}: {text}"))
            files.append(f"{phase}/{name}")
            release_memory()
        # last: saving with external data moves the weights out of the graph in memory
        write_atomic(sub / "model.onnx", lambda tmp, p=model.proto: onnx.save(
            p, str(tmp), save_as_external_data=True, location="model.onnx.data"))
        files += [f"{phase}/model.onnx", f"{phase}/model.onnx.data"]
        del model
        release_memory()
    return Done(tuple(files))


def host(ctx: Any) -> Done:
    """The host's steps: the tokenizer, the prefix, the KV cache layout, each phase's
    quantized I/O (:func:`quantscope.export.plan_export.device_io_rows`)."""
    from quantscope.export import device_io as dio
    from quantscope.export.plan_export import device_io_rows
    from quantscope.pipeline.decoder_report import host_doc
    from quantscope.serde import read_stats, write_json, write_text
    from quantscope.stages_llm import phase_file
    from quantscope.tasks.lm import tokenizer_path

    plan_, ship = ctx.plan(), shipped(ctx)
    shutil.copyfile(tokenizer_path(phase_file(ctx.spec(), "prefill")), ctx.path(TOKENIZER))
    io, files = {}, [TOKENIZER, HOST, HOST_TEXT]
    for phase in ("prefill", "decode"):
        model = _open_exported(ctx, phase)
        rows = device_io_rows(model, read_stats(ctx.path(ship.stats[phase])),
                              plan_.for_phase(phase))
        del model
        release_memory()
        io[phase] = rows
        write_text(ctx.path(phase) / "io_snippet.py", dio.python_snippet(rows))
        files.append(f"{phase}/io_snippet.py")
    doc = host_doc(plan_, ctx.path("decode") / "model.onnx", io, tokenizer=TOKENIZER,
                   files=(ship.prefix_npz, ship.prefix_py),
                   seq=ctx.opts.seq_len or ctx.opts.rank_setup().seq_len)
    write_json(ctx.path(HOST), doc)
    write_text(ctx.path(HOST_TEXT), host_text(doc))
    return Done(tuple(files))


def _open_exported(ctx: Any, phase: str) -> Any:
    import onnx

    from quantscope.model.load import Model

    path = ctx.path(phase) / "model.onnx"
    return Model(proto=onnx.load(str(path)), source=str(path))


__all__ = ["export", "host"]
