"""quantscope: will an ONNX model survive INT8/INT16 on an edge NPU, and how to plan it.

The Python API mirrors the CLI's stages (see docs/architecture.md)::

    import quantscope as qs
    model = qs.open_model("minilm-l6")                  # path or built-in name
    data = qs.open_data("stdlib-docs", model)
    stats = qs.calibrate_model(model, data)
    plan = qs.Plan.uniform(qs.Precision.A8_W8)
    result = qs.evaluate_plan(model, data, stats, plan)  # result["metrics"]
    qdq, notes = qs.qdq_for_plan(model, stats, plan)   # the exported QDQ model
    rows = qs.device_io_rows(model, stats, plan)        # how to feed/read the device
    q = qs.to_device(x, rows[0]); y = qs.from_device(q_out, rows[-1])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantscope.lazy import lazy_face

# The package face imports nothing heavy: each public name is loaded from its module on
# first use (PEP 562), so `import quantscope` (the CLI's first step) costs milliseconds
# and a Ctrl-C during start-up meets no half-imported numerics.
_HOMES = {
    "calibrate": "quantscope.calibrate.collect",
    "encode": "quantscope.emulate.encode",
    "QdqModel": "quantscope.emulate.qdq", "build_qdq": "quantscope.emulate.qdq",
    "quantize_model": "quantscope.emulate.qdq", "scheme_for": "quantscope.emulate.qdq",
    "check_mapping": "quantscope.export.device_io", "from_device": "quantscope.export.device_io",
    "parse_mapping": "quantscope.export.device_io", "to_device": "quantscope.export.device_io",
    "find_groups": "quantscope.model.groups",
    "Model": "quantscope.model.load", "load": "quantscope.model.load",
    "load_proto": "quantscope.model.load",
    **{name: "quantscope.stages" for name in (
        "Dataset", "calibrate_model", "device_io_rows", "evaluate_plan", "evaluate_plans",
        "export_plan", "open_data", "open_model", "qdq_for_plan")},
    **{name: "quantscope.types" for name in (
        "Encoding", "Encodings", "Group", "Groups", "Plan", "Precision", "Problem",
        "QuantScheme", "QuantscopeError", "Stats")},
}

if TYPE_CHECKING:  # pragma: no cover - for type checkers and readers
    from quantscope.calibrate.collect import calibrate
    from quantscope.emulate.encode import encode
    from quantscope.emulate.qdq import QdqModel, build_qdq, quantize_model, scheme_for
    from quantscope.export.device_io import check_mapping, from_device, parse_mapping, to_device
    from quantscope.model.groups import find_groups
    from quantscope.model.load import Model, load, load_proto
    from quantscope.stages import (
        Dataset,
        calibrate_model,
        device_io_rows,
        evaluate_plan,
        evaluate_plans,
        export_plan,
        open_data,
        open_model,
        qdq_for_plan,
    )
    from quantscope.types import (
        Encoding,
        Encodings,
        Group,
        Groups,
        Plan,
        Precision,
        Problem,
        QuantScheme,
        QuantscopeError,
        Stats,
    )


__getattr__, __dir__ = lazy_face(__name__, _HOMES)


from quantscope.version import __version__ as __version__  # noqa: E402  (lowest layer)

__all__ = [
    "Dataset", "Encoding", "Encodings", "Group", "Groups", "Model", "Plan", "Precision",
    "Problem", "QdqModel", "QuantScheme", "QuantscopeError", "Stats", "build_qdq",
    "calibrate", "calibrate_model", "check_mapping", "device_io_rows", "encode",
    "evaluate_plan", "evaluate_plans", "export_plan", "find_groups", "from_device", "load",
    "load_proto", "open_data", "open_model", "parse_mapping", "qdq_for_plan",
    "quantize_model", "scheme_for", "to_device",
]
