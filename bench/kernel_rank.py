"""Ruled out (stop 57): ranking the planner's candidates on ONNX Runtime's integer kernels.

ORT fuses a QDQ graph's groups into its integer kernels when its optimizations are on
(``MatMulIntegerToFloat``, ``QLinearMatMul``, ``QLinearAdd``, ``QLinearSoftmax`` ...). On a
CPU with VNNI that runs a full pass of minilm-l6 at uniform a8_w8 2–3× faster than the
emulation (optimizations off). Would ranking on them give the issue's 5× more candidate
evaluations per minute, with the chosen plan measured again by the emulation?

This script runs ``bench/search.py``'s measured greedy walk (17 plans) in one process:
``today`` (the baseline), ``incremental+cheap`` (the planner's evaluator) and
``kernels`` (that evaluator with every segment session on ORT's integer kernels, the
Softmax's fusion blocked: an ``Identity`` between each DequantizeLinear and a Softmax,
which ORT's selectors then do not match, ``EliminateIdentity`` off; ``--softmax-fused``
leaves it fused). The walk's chosen plan is then measured again by the emulation
(``confirmed_in_ort``). Then, for uniform a8_w8 and the kernels walk's chosen plan,
top-1 agreement by the emulation, by one full-graph kernel session and by the incremental
kernel runner.

    PYTHONPATH=src python bench/kernel_rank.py --model minilm-l6 --pairs 64
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import onnx
import onnxruntime as ort
from onnx import helper

from quantscope.analyze import incremental
from quantscope.emulate import session as qs_session
from quantscope.threads import default_threads

_SPEC = importlib.util.spec_from_file_location("bench_search", Path(__file__).with_name("search.py"))
search = importlib.util.module_from_spec(_SPEC)  # type: ignore[arg-type]
sys.modules["bench_search"] = search
_SPEC.loader.exec_module(search)  # type: ignore[union-attr]

SOFTMAX_FUSED = "--softmax-fused" in sys.argv
_EMPTY = helper.make_model(helper.make_graph(
    [helper.make_node("Relu", ["x"], ["y"])], "empty",
    [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
    [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]),
    opset_imports=[helper.make_opsetid("", 13)])


def ranking_form(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with an Identity between each DequantizeLinear and a Softmax reading it."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    dq = {n.output[0] for n in out.graph.node if n.op_type == "DequantizeLinear"}
    nodes = []
    for k, node in enumerate(out.graph.node):
        if node.op_type == "Softmax" and not SOFTMAX_FUSED:
            for i, name in enumerate(node.input):
                if name in dq:
                    nodes.append(helper.make_node("Identity", [name], [f"{name}__blk{k}"],
                                                  name=f"blk{k}_{i}"))
                    node.input[i] = f"{name}__blk{k}"
        nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def kernel_session(proto: onnx.ModelProto, **_: object) -> ort.InferenceSession:
    """A segment session as ``make_session(shared_arena=True)`` makes the runner's (threads,
    the process-wide arena, no spinning), with every optimization on."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = default_threads()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.use_env_allocators", "1")
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(ranking_form(proto).SerializeToString(), opts,
                                providers=qs_session.providers(),
                                disabled_optimizers=["EliminateIdentity"])


def kernels(s: search.Setup) -> search.Evaluate:
    qs_session.make_session(_EMPTY, shared_arena=True)  # registers the process-wide arena
    incremental.make_session = kernel_session  # the runner's segment sessions, this process
    measure = search.cheap(s)
    measure.ranked_by = "ort integer kernels (incremental)"  # type: ignore[attr-defined]
    return measure


def fidelity(model_name: str, pairs: int, groups: list[str]) -> None:
    from quantscope import stages
    from quantscope.analyze.measure import qdq_for_plan
    from quantscope.emulate.evaluate import run_model
    from quantscope.tasks.registry import at_length
    from quantscope.types import Outputs, Plan, Precision, QuantScheme, sample_first

    model = stages.open_model(model_name)
    data = at_length(stages.open_data("stdlib-docs", model, max_pairs=pairs), 128)
    stats = stages.calibrate_model(model, data)
    batches = list(data.evaluation)
    ref = run_model(model.proto, batches)
    for plan in (Plan.uniform(Precision.A8_W8),
                 Plan(default=Precision.A8_W8,
                      overrides=tuple((g, Precision.A16_W16) for g in groups))):
        qdq, _ = qdq_for_plan(model, stats, plan)
        emulated = run_model(qdq, batches)
        sess = kernel_session(qdq)
        names = tuple(o.name for o in sess.get_outputs())
        full = Outputs(names=names, batches=tuple(tuple(sample_first(sess.run(None, b), b))
                                                  for b in batches))
        runner = incremental.IncrementalRunner(model, stats, batches, scheme=QuantScheme())
        inc = runner.outputs(plan)
        top1 = {k: data.task.metrics(ref, o).values["top1_agreement"]  # type: ignore[union-attr]
                for k, o in (("emulated", emulated), ("kernels_full", full),
                             ("kernels_incremental", inc))}
        print("fidelity:", json.dumps({"groups_at_16_bit": len(plan.overrides), **top1}))


def main() -> None:
    argv = [a for a in sys.argv[1:] if a != "--softmax-fused"]
    if "--variants" not in argv:
        argv += ["--variants", "today,incremental+cheap,kernels"]
    search.VARIANTS["kernels"] = kernels
    out = Path("/tmp/kernel_rank.json")
    sys.argv = [sys.argv[0], *argv, "--no-outputs-only", "--json", str(out)]
    search.main()
    doc = json.loads(out.read_text())
    chosen = next(r for r in doc["rows"] if r["variant"] == "kernels")["chosen_plan"]
    fidelity(doc["model"], doc["pairs"], chosen)


if __name__ == "__main__":
    main()
