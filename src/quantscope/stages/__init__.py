"""Stage composition used by the CLI and the Python API.

This package composes the stage functions (load, find_groups, calibrate, encode,
build_qdq, evaluate) and re-exports, under ``quantscope.stages``, every name the
commands use; nothing here holds state between calls. The pieces live where they belong:

- :mod:`quantscope.stages.open`: a model, its data, its calibration, its groups, shapes;
- :mod:`quantscope.stages.files`: text/JSON files, opset, the tokenizer beside a model;
- :mod:`quantscope.stages.rewrites`: the graph rewrites, their FP32 function checked;
- :mod:`quantscope.stages.plan`: the plan search bound to emulation, fine-tune, verdict;
- :mod:`quantscope.analyze.measure`: a plan measured by real emulation (``evaluate_plans``);
- :mod:`quantscope.analyze.whatif`: where a plan's error is, and the goal's headroom;
- :mod:`quantscope.report.console`: the console forms of results;
- :mod:`quantscope.export.plan_export`: a plan in a vendor format, and its checks.
"""

from __future__ import annotations

from quantscope.analyze.measure import (
    FIDELITY_PRIMARIES,
    SATURATION_ROWS,
    _saturation_entry,
    _saturation_stats,
    default_metric,
    evaluate_plan,
    evaluate_plans,
    headline,
    output_channel_axes,
    qdq_for_plan,
    scorer_for,
)
from quantscope.analyze.whatif import (
    ERROR_SCALES,
    WHATIF_KEYS,
    _headroom,
    headroom_sentence,
    needed_scale,
    whatif_families,
)
from quantscope.calibrate.collect import calibrate
from quantscope.emulate.evaluate import (
    compare_model,
    compare_models,
    kept,
    open_runs,
    run_model,
    scale_error,
)
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.lazy import lazy_face
from quantscope.model.groups import find_groups
from quantscope.model.load import Model, load, load_proto
from quantscope.progress import say
from quantscope.serde import (
    plan_to_dict,
    read_json,
    read_plan,
    read_stats,
    write_json,
    write_onnx,
    write_plan,
    write_stats,
    write_text,
)
from quantscope.stages.files import opset_of, read_json_file, read_text, tokenizer_beside
from quantscope.stages.open import (
    _layout_text,
    calibrate_model,
    describe_groups,
    held_out,
    open_data,
    open_model,
    plan_problems,
    resolve_model_path,
    shape_note,
)
from quantscope.stages.plan import (
    HEADSPLIT_HINT,
    TOKENSPLIT_HINT,
    UNIFORM_PLANNER,
    PlanOptions,
    PlanResult,
    _call,
    _fit,
    _keep_finetune,
    _measure_all,
    _plan_measure,
    _plan_measurement,
    _plan_repair,
    _uniform_if_enough,
    finetune_chosen,
    goal_verdict,
    plan_evaluator,
    plan_lengths,
    plan_model,
    plan_repair_offer,
    raced_plan,
)
from quantscope.stages.rewrites import (
    out_scale,
    peel_channels,
    scale_rows,
    split_heads,
    split_tokens,
)
from quantscope.tasks.headline import Headline
from quantscope.tasks.registry import at_length
from quantscope.tasks.tensors import TENSOR_BATCH, load_tensor_batches
from quantscope.types import (
    SHARED,
    Batch,
    Dataset,
    Encodings,
    Feeds,
    GroupKind,
    Groups,
    Outputs,
    Plan,
    Precision,
    QuantScheme,
    QuantscopeError,
    Stats,
    batch_rows,
    take_rows,
)

__all__ = [
    "Dataset", "open_model", "open_data", "calibrate_model", "qdq_for_plan", "evaluate_plan",
    "format_result", "describe_groups", "read_plan", "read_stats", "write_json", "write_onnx",
    "write_stats", "opset_of", "load_proto", "write_plan", "write_text", "evaluate_plans",
    "export_plan", "device_io_rows", "plan_problems", "read_text", "read_json_file",
]

# Every other name ``quantscope.stages`` had when it was one module, kept importable from
# here (the CLI, pipeline, tests and bench reach them as ``stages.<name>``).
_REEXPORTED = (
    FIDELITY_PRIMARIES, SATURATION_ROWS, _saturation_entry, _saturation_stats, default_metric,
    headline, output_channel_axes, scorer_for, ERROR_SCALES, WHATIF_KEYS, _headroom,
    headroom_sentence, needed_scale, whatif_families, calibrate, compare_model, compare_models,
    kept, open_runs, run_model, scale_error, quantize_model, scheme_for, find_groups, Model,
    load, say, plan_to_dict, read_json,
    tokenizer_beside, _layout_text, held_out, resolve_model_path, shape_note, HEADSPLIT_HINT,
    TOKENSPLIT_HINT, UNIFORM_PLANNER, PlanOptions, PlanResult, _call, _fit, _keep_finetune,
    _measure_all, _plan_measure, _plan_measurement, _plan_repair, _uniform_if_enough,
    finetune_chosen, goal_verdict, plan_evaluator, plan_lengths, plan_model, plan_repair_offer,
    raced_plan, out_scale, peel_channels, scale_rows, split_heads, split_tokens, Headline,
    at_length, TENSOR_BATCH, load_tensor_batches, SHARED, Batch, Encodings, Feeds, GroupKind,
    Groups, Outputs, Plan, Precision, QuantScheme, QuantscopeError, Stats, batch_rows,
    take_rows,
)

# The console forms and the plan export are imported on first use (``stages.export_plan``,
# ``from quantscope.stages import format_result``): importing ``stages`` stays as light as
# it was when they lived in ``stages.py``.
_LAZY = {
    **dict.fromkeys(("OUTPUT_LINE", "_coverage_lines", "format_result", "format_search",
                     "format_whatif"), "quantscope.report.console"),
    **dict.fromkeys(("FORMAT_VENDORS", "alls_target", "check_plan_format", "check_plan_target",
                     "device_io_rows", "export_plan", "float_io_rows", "forced_ranges",
                     "qnn_unencoded", "scripted_deployment", "scripted_plan"),
                    "quantscope.export.plan_export"),
}


__getattr__, __dir__ = lazy_face(__name__, _LAZY)
