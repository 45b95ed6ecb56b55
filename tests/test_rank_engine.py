"""--rank-engine: the torch interpreter ranks candidate plans, ORT measures what is reported.

The ranker builds the torch graph once (the QDQ graph of uniform a8_w8) and swaps only the
quantizers per plan; its outputs equal ORT's on the plan's own QDQ graph (float32 sums in
another order: 1e-4 of the output's scale), so a search ranked by torch chooses what ORT
would, and the output says which engine ranked and which measured.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
import tiny_models as tm
import torch
from onnx import TensorProto, helper, numpy_helper

from quantscope import stages
from quantscope.calibrate.collect import calibrate
from quantscope.emulate.qdq import quantize_model
from quantscope.emulate.session import make_session
from quantscope.finetune.engine import resolve_engine
from quantscope.finetune.rank import TorchRanker
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.targets import load_target
from quantscope.types import Plan, Precision, QuantScheme, QuantscopeError, Sensitivity

CUDA = torch.cuda.is_available()
TOL = 1e-4  # of each output's largest magnitude: float32 sums in another order
VOCAB, HIDDEN = 30522, 16


def text_encoder() -> onnx.ModelProto:
    """tokens = W2 . relu(W1 . table[ids] + b1): two Linears a plan can put anywhere."""
    r = np.random.default_rng(7)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("table", r.standard_normal((VOCAB, HIDDEN))), ("w1", r.normal(0, 0.4, (HIDDEN, 32))),
        ("b1", r.normal(0, 0.1, 32)), ("w2", r.normal(0, 0.3, (32, HIDDEN))))]
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["emb"]),
             helper.make_node("MatMul", ["emb", "w1"], ["h0"]),
             helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h"]),
             helper.make_node("MatMul", ["h", "w2"], ["tokens"])]
    ins = [helper.make_tensor_value_info(n, TensorProto.INT64, ["B", "S"])
           for n in ("input_ids", "attention_mask")]
    out = [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["B", "S", HIDDEN])]
    graph = helper.make_graph(nodes, "enc", ins, out, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def encoder():
    model = load_proto(text_encoder(), "rank-encoder")
    # enough pairs that a promotion's gain (+0.3 dB) clears its noise: on 24 the no-goal
    # choice keeps the cheaper plan (±0.34 dB), as it should
    data = stages.open_data("stdlib-docs", model, max_pairs=64)
    return model, data, stages.calibrate_model(model, data)


def _linears(model):
    return [g.name for g in find_groups(model).groups if g.weight is not None]


def _plans(model) -> dict[str, Plan]:
    first, second = _linears(model)
    return {
        "float": Plan.uniform(Precision.FLOAT),
        "a16_w16": Plan.uniform(Precision.A16_W16),
        "a8_w8": Plan.uniform(Precision.A8_W8),
        "first_w4": Plan(default=Precision.A16_W16, overrides=((first, Precision.A8_W4),)),
        "second_w4": Plan(default=Precision.A16_W16, overrides=((second, Precision.A8_W4),)),
        "a8_w4": Plan.uniform(Precision.A8_W4),
    }


@pytest.mark.parametrize("name", list(tm.ALL))
def test_ranker_outputs_equal_ort_on_each_plans_qdq_graph(name):
    """One torch graph, quantizers swapped per plan (float groups, 4/8/16 bit, per-channel
    weights) = ORT on the QDQ graph ``quantize_model`` writes for that plan."""
    model = load_proto(tm.ALL[name](), name)
    groups = find_groups(model)
    feeds = [tm.sample_inputs(model.proto, seed=i) for i in range(3)]
    stats = calibrate(model, groups, feeds)
    scheme = QuantScheme()
    ranker = TorchRanker(model, stats, feeds, scheme=scheme)
    first = groups.names()[0]
    plans = [*(Plan.uniform(p) for p in Precision),
             Plan(default=Precision.A8_W4, overrides=((first, Precision.FLOAT),))]
    for plan in plans:
        session = make_session(quantize_model(model, stats, plan, scheme=scheme).proto)
        for feed, ours in zip(feeds, ranker.outputs(plan).batches, strict=True):
            for a, ref in zip(ours, session.run(None, feed), strict=True):
                np.testing.assert_allclose(a, ref, rtol=0, atol=TOL * np.abs(ref).max())


def test_torch_ranks_plans_in_orts_order(encoder):
    """Clearly better and clearly worse plans, both ways round: the metric by torch is
    ORT's within 1e-4 and the order is the same."""
    model, data, stats = encoder
    plans = _plans(model)
    ort = stages.evaluate_plans(model, data, stats, plans, saturation=False)
    measure = __import__("quantscope.finetune.rank", fromlist=["TorchMeasure"]).TorchMeasure(
        model, data, scheme=None, device="cpu")
    key = "embedding_sqnr_db"
    by_ort = {k: ort[k]["metrics"][key] for k in plans}
    by_torch = {k: measure(model, stats, p)[key] for k, p in plans.items()}
    assert by_ort["a16_w16"] > by_ort["a8_w8"] > by_ort["a8_w4"] + 3  # clearly ordered
    assert by_ort["first_w4"] != pytest.approx(by_ort["second_w4"], abs=0.5)
    finite = [k for k in plans if np.isfinite(by_ort[k])]
    for k in finite:
        assert by_torch[k] == pytest.approx(by_ort[k], abs=0.01), k
    assert sorted(finite, key=by_torch.get) == sorted(finite, key=by_ort.get)
    assert measure.plans == len(plans)


def _sensitivity(model, prefer: int = 1) -> Sensitivity:
    """The analysis predicts linear ``prefer`` (0 or 1) the better promotion."""
    gains = [1.0, 1.0]
    gains[prefer] = 3.0
    return Sensitivity(metric="output_sqnr_db", base=10.0, gains=tuple(
        (g, ((Precision.A16_W16, gain),)) for g, gain in zip(_linears(model), gains,
                                                               strict=True)))


def _search(encoder, engine, prefer):
    model, data, stats = encoder
    # room for one Linear at a16_w16 (ort-cpu: 2.29 and 2.31 x uniform a8_w8), not two
    opts = stages.PlanOptions(max_cost=2.32, metric="embedding_sqnr_db", rank_engine=engine)
    return stages.plan_model(model, _sensitivity(model, prefer), load_target("ort-cpu"), opts,
                             data=data, stats=stats)


@pytest.mark.parametrize("prefer", [0, 1])
def test_search_ranked_by_torch_chooses_orts_plan_and_reports_ort(encoder, prefer):
    """Whichever Linear the analysis prefers, the search ranked by torch ends on the plan
    the search ranked by ORT ends on; the figures reported are ORT's."""
    model, data, stats = encoder
    out, ort = _search(encoder, "torch", prefer), _search(encoder, "ort", prefer)
    assert out.plan.overrides == ort.plan.overrides
    assert [g for g, _ in out.plan.overrides] == [_linears(model)[prefer]]
    chosen, e = out.pareto["chosen"], out.pareto["engines"]
    measured = stages.evaluate_plan(model, data, stats, out.plan,
                                    saturation=False)["metrics"]["embedding_sqnr_db"]
    assert chosen["measured"] == pytest.approx(measured, abs=1e-5)  # ORT's figure
    assert ort.pareto["chosen"]["measured"] == chosen["measured"]
    assert dict(out.plan.meta)["measured"] == f"{chosen['measured']:.6g}"
    assert e["line"] == "ranked by torch (cpu), measured by onnxruntime"
    assert chosen["ranked"] == pytest.approx(measured, abs=0.01)
    assert e["difference"] == pytest.approx(chosen["ranked"] - chosen["measured"], abs=1e-6)
    assert dict(out.plan.meta)["ranked_by"] == "torch (cpu)"
    trials = out.pareto["trials"]
    assert len(trials) >= 2 and all(t.get("ranked") is not None for t in trials)
    assert sum(t["measured"] is not None for t in trials) == 1  # the chosen one, by ORT
    text = stages.format_search(out.pareto)
    assert "search: ranked by torch (cpu), measured by onnxruntime; chosen plan" in text
    assert ort.pareto["engines"]["line"] == "ranked and measured by onnxruntime"
    assert "ranked" not in ort.pareto["chosen"]
    assert "search: ranked and measured by onnxruntime" in stages.format_search(ort.pareto)


def test_search_with_repairs_ranked_by_torch_chooses_orts_plan_and_repairs(encoder):
    """Plans that list repairs are repaired as before and their repaired model ranked by
    torch (converted once per repaired model): the same precisions and repairs as ORT's
    search, each trial's ranked figure within 0.01 dB of ORT's."""
    model, data, stats = encoder
    runs = {}
    for engine in ("torch", "ort"):
        opts = stages.PlanOptions(max_cost=2.32, metric="embedding_sqnr_db", rank_engine=engine,
                                  repairs=("bias", "equalize"))
        runs[engine] = stages.plan_model(model, _sensitivity(model, 0), load_target("ort-cpu"),
                                         opts, data=data, stats=stats)
    torch_run, ort_run = runs["torch"], runs["ort"]
    assert torch_run.plan.overrides == ort_run.plan.overrides
    assert dict(torch_run.plan.meta)["repairs"] == dict(ort_run.plan.meta)["repairs"]
    trials = zip(torch_run.pareto["trials"], ort_run.pareto["trials"], strict=True)
    repaired = 0
    for ours, theirs in trials:
        assert ours.get("repairs") == theirs.get("repairs")
        assert ours["ranked"] == pytest.approx(theirs["measured"], abs=0.01)
        repaired += bool(ours.get("repairs"))
    assert repaired >= 2
    assert torch_run.pareto["chosen"]["measured"] == ort_run.pareto["chosen"]["measured"]


def test_auto_picks_ort_without_cuda_and_torch_with_it():
    e = resolve_engine("auto")
    assert (e.name, e.device) == (("torch", "cuda") if CUDA else ("ort", None))
    assert resolve_engine("torch").device == ("cuda" if CUDA else "cpu")
    assert resolve_engine("torch", device="cpu").line == \
        "ranked by torch (cpu), measured by onnxruntime"
    with pytest.raises(QuantscopeError, match="unknown rank engine 'gpu'"):
        resolve_engine("gpu")


def _cli_plan(tmp_path, *flags):
    from quantscope.cli import main

    m, s, a = tmp_path / "enc.onnx", tmp_path / "s.npz", tmp_path / "a.json"
    if not m.exists():
        onnx.save(text_encoder(), m)
        common = ["--data", "stdlib-docs", "--pairs", "24"]
        assert main(["calibrate", str(m), "--data", "stdlib-docs", "--out", str(s)]) == 0
        assert main(["analyze", str(m), *common, "--stats", str(s), "--proxy", "1.0",
                     "--out", str(a)]) == 0
    out = tmp_path / f"plan{len(flags)}.json"
    assert main(["plan", str(m), "--analysis", str(a), "--target", "ort-cpu", "--data",
                 "stdlib-docs", "--pairs", "24", "--stats", str(s), "--max-cost", "2.32",
                 *flags, "--out", str(out)]) == 0
    return stages.read_json_file(out, "plan")


def test_plan_cli_says_which_engine_ranked_and_which_measured(tmp_path, capsys):
    doc = _cli_plan(tmp_path, "--rank-engine", "torch")
    said = capsys.readouterr().out
    assert "search: ranked by torch (cpu), measured by onnxruntime" in said
    assert doc["pareto"]["engines"]["ranked_by"] == "torch (cpu)"
    assert doc["pareto"]["chosen"]["ranked"] is not None
    doc = _cli_plan(tmp_path)  # auto
    said = capsys.readouterr().out
    if not CUDA:
        assert "search: ranked and measured by onnxruntime" in said
        assert doc["pareto"]["engines"]["asked"] == "auto"


def test_without_torch_rank_engine_torch_is_one_line(tmp_path):
    """torch made unimportable in a child process: one line, non-zero, nothing written."""
    out = tmp_path / "p.json"
    code = ("import sys; sys.modules['torch'] = None\n"
            "from quantscope.cli import main\n"
            f"sys.exit(main(['plan', 'minilm-l3', '--analysis', {str(out)!r}, '--target', "
            f"'hailo8', '--rank-engine', 'torch', '--out', {str(out)!r} + '.x']))")
    out.write_text("{}")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--rank-engine torch needs PyTorch" in lines[0]
    assert not (tmp_path / "p.json.x").exists()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(tm.ALL))
def test_cuda_ranker_outputs_equal_ort(name):
    model = load_proto(tm.ALL[name](), name)
    feeds = [tm.sample_inputs(model.proto, seed=i) for i in range(2)]
    stats = calibrate(model, find_groups(model), feeds)
    ranker = TorchRanker(model, stats, feeds, scheme=QuantScheme(), device="cuda")
    for plan in (Plan.uniform(Precision.A8_W8), Plan.uniform(Precision.A16_W8)):
        session = make_session(quantize_model(model, stats, plan, scheme=QuantScheme()).proto)
        for feed, ours in zip(feeds, ranker.outputs(plan).batches, strict=True):
            for a, ref in zip(ours, session.run(None, feed), strict=True):
                np.testing.assert_allclose(a, ref, rtol=0, atol=TOL * np.abs(ref).max())


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_search_chooses_orts_plan(encoder):
    auto, ort = _search(encoder, "auto", 0), _search(encoder, "ort", 0)
    assert auto.pareto["engines"]["ranked_by"] == "torch (cuda)"
    assert auto.plan.overrides == ort.plan.overrides
    assert auto.pareto["chosen"]["measured"] == ort.pareto["chosen"]["measured"]


def test_run_verdict_says_which_engine_ranked_and_the_plan_key_follows_it(tmp_path):
    """run --rank-engine torch: plan.json, verdict.json and the console verdict name both
    engines; asking ort afterwards reruns the plan stage (its key names torch only when
    torch ranked, so the folders of earlier runs stay valid) and says so."""
    import dataclasses

    from quantscope.pipeline import RunOptions, run_pipeline
    from quantscope.pipeline.verdict import format_verdict

    m, x = tmp_path / "m.onnx", tmp_path / "x.npy"
    onnx.save(tm.layernorm_block(), m)
    np.save(x, np.random.default_rng(0).normal(0, 1, (16, 6, 24)).astype(np.float32))
    opts = RunOptions(model=str(m), data=str(x), target="hailo10h", out=str(tmp_path / "W"),
                      repairs=(), rank_engine="torch")
    out = run_pipeline(opts, progress=False)
    r = out.verdict["ranking"]
    assert r["line"] == "ranked by torch (cpu), measured by onnxruntime"
    assert r["measured"] is not None and r["ranked"] == pytest.approx(r["measured"], abs=0.05)
    assert stages.read_json_file(tmp_path / "W" / "plan.json", "plan")["pareto"]["engines"] == r
    assert "search: ranked by torch (cpu), measured by onnxruntime: chosen plan" in \
        format_verdict(out.verdict)
    again = run_pipeline(dataclasses.replace(opts, rank_engine="ort"), progress=False)
    assert "plan" in again.ran and "calibrate" in again.skipped
    assert again.verdict["ranking"]["line"] == "ranked and measured by onnxruntime"
    assert "search: ranked and measured by onnxruntime" in format_verdict(again.verdict)
