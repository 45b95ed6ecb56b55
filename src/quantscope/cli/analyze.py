"""analyze: which layers break the low precision, and why (per group, with the target)."""

from __future__ import annotations

import argparse

from quantscope import stages, stages_llm
from quantscope.analyze import analysis_to_dict, analyze, summary_text
from quantscope.analyze.phases import diagnosis_to_dict, format_diagnosis
from quantscope.cli.inputs import executor, open_inputs
from quantscope.cli.options import (
    PROMOTION,
    command,
    data_parent,
    model_parent,
    output_parent,
    pairs_parent,
    ray_parent,
    stats_parent,
    target_parent,
    tokenizer_parent,
)
from quantscope.cli.types import check_low_high, fraction, output_file, phases, precision
from quantscope.model.groups import find_groups
from quantscope.report import fmt
from quantscope.stages.usable import unusable_groups
from quantscope.types import Precision, QuantscopeError, batch_rows


def add_analyze(sub: argparse._SubParsersAction, summary: str) -> None:
    an = command(sub, "analyze", summary,
                 example="quantscope analyze minilm-l6 --data stdlib-docs --stats stats.npz "
                 "--target hailo10h --out analysis.json",
                 parents=(model_parent(), data_parent(required=False),
                          output_parent(), stats_parent(required=False),
                          target_parent(required=False, help="target profile (its "
                                        "quantization scheme is used)"),
                          tokenizer_parent(), pairs_parent(128, "analysed"),
                          ray_parent()))
    an.add_argument("--low", default="a8_w8", type=precision,
                    help="the precision to diagnose (default a8_w8)")
    an.add_argument("--high", default=None, type=precision,
                    help=f"the precision a promoted group gets (default: {PROMOTION})")
    an.add_argument("--proxy", type=fraction, default=0.125,
                    help="row-cost budget of the sweeps: enable-one on every "
                    "round(2/PROXY)-th row, disable-one on the noisiest rows worth PROXY of "
                    "the row cost (1.0 = exact, every row, task metric per candidate; "
                    "default 0.125)")
    an.add_argument("--phase", type=phases, metavar="prefill,decode",
                    help="a decoder LLM (e.g. smollm2-135m): per phase, from its own "
                    "calibration on stdlib-docs text (no --data/--stats): the widest "
                    "ranges and outlier channels, the first token, the KV cache, the "
                    "RMSNorm inputs, and which groups are predicted to break 8 bit")
    an.add_argument("--out", type=output_file, required=True,
                    help="analysis JSON to write")


def cmd_analyze(args: argparse.Namespace) -> int:
    if getattr(args, "phase", None):
        return _analyze_phases(args)
    missing = [f for f, v in (("--data", args.data), ("--stats", args.stats)) if not v]
    if missing:
        raise QuantscopeError(f"analyze: the following arguments are required: "
                              f"{', '.join(missing)} (see 'quantscope analyze --help')")
    if args.high is not None:
        check_low_high(args.low, args.high)  # before anything is opened
    inp = open_inputs(args, data=True, stats=True, target=True)
    if args.high is None:
        args.high = inp.target.promote if inp.target is not None else Precision.A16_W16
        check_low_high(args.low, args.high)
    samples = _tensor_samples(inp.data)
    if samples is not None and samples < 2:
        raise QuantscopeError(f"data '{args.data}' has {samples} sample(s), and analyze "
                              "compares the samples' outputs (a collapse shows only across "
                              "two or more): give at least 2 samples")
    if inp.data.task is None or getattr(inp.data.task, "row_local", False):
        from quantscope.tasks.sizes import check_one_size

        check_one_size(inp.model, inp.data, args.data, "analyze")
    groups = find_groups(inp.model)
    skip = unusable_groups(inp.model, inp.target, low=args.low, high=args.high, groups=groups)
    pool = executor(args.ray)
    try:
        result = analyze(inp.model, groups, inp.stats,
                         list(inp.data.evaluation),
                         scorer=stages.scorer_for(inp.data, inp.model), low=args.low,
                         high=args.high, target=inp.target,
                         proxy_fraction=args.proxy, progress=True, executor=pool, skip=skip)
    finally:
        if pool is not None:
            pool.close()
    print(summary_text(result, figure=fmt.value))  # shares in percent, as the verdict
    stages.write_json(args.out, analysis_to_dict(result))
    print(f"wrote {args.out}")
    return 0


def _tensor_samples(ds: stages.Dataset | None) -> int | None:
    """The evaluation samples of tensor data (each batch's along its inputs' sample axes),
    or None for a task's data (pairs, images), which counts its own."""
    if ds is None or (ds.task is not None and not getattr(ds.task, "row_local", False)):
        return None
    return sum(batch_rows(b) for b in ds.evaluation)


def _analyze_phases(args: argparse.Namespace) -> int:
    """analyze --phase: what each phase graph's calibration says (predictions, no sweep)."""
    if args.data or args.stats:
        raise QuantscopeError("analyze --phase calibrates each phase graph on stdlib-docs "
                              "text itself: leave out --data and --stats")
    out = stages_llm.diagnose_model(args.model, args.phase)
    print("\n".join(format_diagnosis(out)))
    stages.write_json(args.out, diagnosis_to_dict(out))
    print(f"wrote {args.out}")
    return 0
