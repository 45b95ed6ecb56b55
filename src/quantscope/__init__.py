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

import importlib
from typing import Any

# name -> the module that defines it; imported on first use (PEP 562), so that
# ``python -m quantscope`` and the ``quantscope`` script start before the heavy imports
# (onnx, numpy, ONNX Runtime) and a Ctrl-C during them is the CLI's one line, not a traceback
_EXPORTS: dict[str, str] = {
    "calibrate": "quantscope.calibrate.collect",
    "encode": "quantscope.emulate.encode",
    **dict.fromkeys(("QdqModel", "build_qdq", "quantize_model", "scheme_for"),
                    "quantscope.emulate.qdq"),
    **dict.fromkeys(("check_mapping", "from_device", "parse_mapping", "to_device"),
                    "quantscope.export.device_io"),
    "find_groups": "quantscope.model.groups",
    **dict.fromkeys(("Model", "load", "load_proto"), "quantscope.model.load"),
    **dict.fromkeys(("Dataset", "calibrate_model", "device_io_rows", "evaluate_plan",
                     "evaluate_plans", "export_plan", "open_data", "open_model",
                     "qdq_for_plan"), "quantscope.stages"),
    **dict.fromkeys(("Encoding", "Encodings", "Group", "Groups", "Plan", "Precision",
                     "Problem", "QuantScheme", "QuantscopeError", "Stats"),
                    "quantscope.types"),
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'quantscope' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__version__ = "0.1.0"

__all__ = [
    "Dataset", "Encoding", "Encodings", "Group", "Groups", "Model", "Plan", "Precision",
    "Problem", "QdqModel", "QuantScheme", "QuantscopeError", "Stats", "build_qdq",
    "calibrate", "calibrate_model", "check_mapping", "device_io_rows", "encode",
    "evaluate_plan", "evaluate_plans", "export_plan", "find_groups", "from_device", "load",
    "load_proto", "open_data", "open_model", "parse_mapping", "qdq_for_plan",
    "quantize_model", "scheme_for", "to_device",
]
