"""onnxruntime's symbolic shape inference on a model proto: the one place it is loaded
and run (:mod:`quantscope.model.shapes` reads its shapes; :mod:`.softmax_rank` the ranks
the opset conversion needs, before a :class:`~quantscope.model.load.Model` exists)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx


def _symbolic_shape_infer() -> tuple[Any, Any]:
    """onnxruntime's ``SymbolicShapeInference`` and ``get_opset``, its module loaded from
    its file when the ``onnxruntime.tools`` package is not imported yet: that package's
    ``__init__`` imports torch (about 190 MB resident) for its PyTorch export helpers
    alone, which the shape inference (onnx, numpy, sympy) does not use."""
    import importlib.util
    import sys

    name = "onnxruntime.tools.symbolic_shape_infer"
    module = sys.modules.get(name) or sys.modules.get("_quantscope_symbolic_shape_infer")
    if module is None and "onnxruntime.tools" in sys.modules:
        module = importlib.import_module(name)
    if module is None:
        spec = importlib.util.find_spec("onnxruntime")
        assert spec is not None and spec.submodule_search_locations
        path = Path(next(iter(spec.submodule_search_locations))) / "tools" / \
            "symbolic_shape_infer.py"
        loaded = importlib.util.spec_from_file_location("_quantscope_symbolic_shape_infer",
                                                        path)
        assert loaded is not None and loaded.loader is not None
        module = importlib.util.module_from_spec(loaded)
        sys.modules[loaded.name] = module
        loaded.loader.exec_module(module)
    return module.SymbolicShapeInference, module.get_opset


def preload() -> None:
    """Load onnxruntime's symbolic shape inference (and sympy) now, not at its first use."""
    _symbolic_shape_infer()


def symbolic_proto(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """``proto`` with the value_info onnxruntime's symbolic shape inference gives (None
    when it cannot run on this graph or leaves it incomplete)."""
    try:
        SymbolicShapeInference, get_opset = _symbolic_shape_infer()
        infer = SymbolicShapeInference(2**31 - 1, True, False, 0)
        if (get_opset(proto) or 0) >= 18:  # ReduceMax 18+ is ReduceSum 13+'s spec (rowscale)
            infer.dispatcher_.setdefault("ReduceMax", infer._infer_ReduceSum)
        infer._preprocess(proto)
        complete = False
        while infer.run_:
            complete = infer._infer_impl()
        infer._update_output_from_vi()
    except Exception:  # noqa: BLE001 - any failure: keep what ONNX inferred
        return None
    return infer.out_mp_ if complete else None
