"""Length buckets (``quantscope route``): each text runs on the shortest compiled length
that holds it; legality and cost per bucket at its own length; task metrics of the routed
outputs against the FP32 reference."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_tasks_text import HIDDEN, tiny_encoder

from quantscope import stages
from quantscope.cli import main
from quantscope.emulate.evaluate import kept, run_model
from quantscope.model.load import load_proto
from quantscope.serde import write_plan
from quantscope.stages_route import (
    Bucket,
    Deployment,
    deployment_costs,
    evaluate_deployment,
    read_deployment,
    route,
    routed_outputs,
)
from quantscope.types import Plan, Precision, QuantscopeError

SHORT = 24
PAIRS = 20


def _target(tmp_path: Path) -> Path:
    """ort-cpu's precisions and costs, plus a size rule that binds above SHORT tokens."""
    text = (Path(stages.__file__).parent / "targets" / "ort_cpu.toml").read_text()
    rule = (
        '\n[[rules]]\nid = "test.wide"\ncheck = "act16_wide_non_conv"\nseverity = "error"\n'
        'reason = "a 16-bit tensor this wide does not fit (test rule)"\n'
        'provenance = "tests/test_route.py"\nfix = "keep it at 8 bit or shorten the sequence"\n'
        f'params = {{ max_values = {{ value = {(SHORT + 1) * HIDDEN} }}, exempt_kinds = [] }}\n'
    )
    text = text.replace("\n[cost]", rule + "\n[cost]", 1)
    path = tmp_path / "tiny_target.toml"
    path.write_text(text)
    return path


@pytest.fixture()
def setup(tmp_path: Path):
    proto = tiny_encoder(inputs=("input_ids", "attention_mask"))
    model_file = tmp_path / "tiny.onnx"
    onnx.save(proto, model_file)
    model = load_proto(proto, "tiny-encoder")
    data = stages.open_data("stdlib-docs", model, max_pairs=PAIRS)
    stats = stages.calibrate_model(model, data)
    stages.write_stats(tmp_path / "tiny.npz", stats)
    target = str(_target(tmp_path))
    hi = Plan(default=Precision.A16_W16, target=target)
    lo = Plan(default=Precision.A8_W8, target=target)
    write_plan(tmp_path / "hi.json", hi)
    write_plan(tmp_path / "lo.json", lo)
    return tmp_path, model, data, stats, hi, lo


def _deployment(tmp_path: Path, buckets: list[dict], name: str = "dep.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"buckets": buckets}))
    return path


def _embeddings(model, data, stats, plan) -> np.ndarray:
    """Every text's pooled output under ``plan`` (task order), the plain evaluate way."""
    q, _ = stages.qdq_for_plan(model, stats, plan)
    task = data.task
    out = kept(run_model(q, list(data.evaluation)), data.evaluation, task.keep)
    return np.concatenate(task.embeddings(out, normalize=False))


def test_route_picks_the_shortest_bucket_that_holds_the_text():
    np.testing.assert_array_equal(route(np.array([1, 32, 33, 64, 65, 256, 900]), (32, 64, 256)),
                                  [0, 0, 1, 1, 2, 2, 2])


def test_each_text_gets_its_buckets_outputs(setup):
    tmp_path, model, data, stats, hi, lo = setup
    data = stages.at_length(data, 64)
    dep = Deployment(buckets=(Bucket(SHORT, model, stats, hi), Bucket(64, model, stats, lo)),
                     target=hi.target or "")
    r = routed_outputs(model, data, dep)
    lengths = np.asarray(data.token_lengths)
    short = np.minimum(lengths, 64) <= SHORT
    assert 0 < short.sum() < len(short)  # both buckets get texts
    np.testing.assert_array_equal(r.which, np.where(short, 0, 1))
    got = np.concatenate(data.task.embeddings(r.routed, normalize=False))
    want = np.where(short[:, None], _embeddings(model, data, stats, hi),
                    _embeddings(model, data, stats, lo))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    alone = np.concatenate(data.task.embeddings(r.longest_alone, normalize=False))
    np.testing.assert_allclose(alone, _embeddings(model, data, stats, lo), rtol=0, atol=1e-6)
    assert not np.allclose(got, alone)  # the short texts did run on the other plan


def test_one_bucket_measures_what_evaluate_at_that_length_measures(setup):
    tmp_path, model, data, stats, hi, lo = setup
    res = evaluate_deployment(model, data, Deployment((Bucket(64, model, stats, lo),),
                                                      target=lo.target or ""))
    ev = stages.evaluate_plan(model, stages.at_length(data, 64), stats, lo, saturation=False)
    for key in ("top1_agreement", "embedding_cosine_mean", "recall@1"):
        assert res["metrics"][key] == pytest.approx(ev["metrics"][key], abs=1e-6)
    assert res["cost_mean"] == pytest.approx(1.0) and res["buckets"][0]["share"] == 1.0


def test_costs_are_relative_to_the_longest_uniform_a8_and_legality_is_per_length(setup):
    tmp_path, model, data, stats, hi, lo = setup
    dep = Deployment((Bucket(SHORT, model, stats, hi), Bucket(SHORT * 4, model, stats, lo)),
                     target=hi.target or "")
    c = deployment_costs(model, dep)
    assert c[1]["cost"] == pytest.approx(1.0)  # uniform a8_w8 at the longest length
    assert c[0]["cost_own"] > 1.0  # 16 bit costs more than a8_w8 at the same length
    # its cost in the longest length's a8_w8 units: the token-wise work is a quarter
    from quantscope.model.groups import find_groups
    from quantscope.model.shapes import given_shapes
    from quantscope.plan.cost import cost_breakdown
    from quantscope.targets import load_target

    def a8(n: int) -> float:
        return sum(cost_breakdown(lo, find_groups(model), load_target(hi.target),
                                  given_shapes(model, n), model=model).values())
    assert a8(SHORT) / a8(SHORT * 4) == pytest.approx(0.25, abs=0.02)
    assert c[0]["cost"] == pytest.approx(c[0]["cost_own"] * a8(SHORT) / a8(SHORT * 4), rel=1e-9)
    assert c[0]["legal"] and c[1]["legal"]
    # the same 16-bit plan at the longer length breaks the size rule
    wide = deployment_costs(model, Deployment((Bucket(SHORT * 4, model, stats, hi),),
                                              target=hi.target or ""))
    assert not wide[0]["legal"] and wide[0]["problems"][0]["rule"] == "test.wide"


def test_mean_cost_weights_each_bucket_by_its_share(setup):
    tmp_path, model, data, stats, hi, lo = setup
    res = evaluate_deployment(model, data, Deployment(
        (Bucket(SHORT, model, stats, hi), Bucket(64, model, stats, lo)), target=hi.target or ""))
    b = res["buckets"]
    assert sum(p["share"] for p in b) == pytest.approx(1.0)
    assert res["cost_mean"] == pytest.approx(sum(p["share"] * p["cost"] for p in b))
    assert res["legal"] and res["longest_alone"]["seq_len"] == 64
    # 16 bit on the short texts is closer to FP32 than 8 bit on every text
    assert res["metrics"]["embedding_cosine_mean"] > res["longest_alone"]["metrics"][
        "embedding_cosine_mean"]


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()
            if p.is_file()}


def test_cli_route_writes_json_and_a_verdict_and_leaves_inputs_alone(setup, capsys):
    tmp_path, *_ = setup
    dep = _deployment(tmp_path, [
        {"seq_len": SHORT, "model": "tiny.onnx", "stats": "tiny.npz", "plan": "hi.json"},
        {"seq_len": 64, "model": "tiny.onnx", "stats": "tiny.npz", "plan": "lo.json"}])
    before = _hashes(tmp_path)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "route.json"
    rc = main(["route", str(tmp_path / "tiny.onnx"), "--data", "stdlib-docs", "--pairs",
               str(PAIRS), "--deployment", str(dep), "--max-cost", "0.01", "--goal", "0.5",
               "--json", str(out)])
    cap = capsys.readouterr()
    text = cap.out
    assert rc == 0, cap.err
    assert "2 compiled lengths (24, 64)" in text and "routed: mean cost" in text
    assert "verdict: NOT MET" in text and "OVER 0.01x" in text
    assert "note (bucket 24, 64): coverage:" in text  # what each bucket's QDQ graph left float
    res = json.loads(out.read_text())
    assert res["verdict"]["within_cost"] is False and res["seq_lens"] == [SHORT, 64]
    assert _hashes(tmp_path) == before  # no input touched (the JSON went to out/)


@pytest.mark.parametrize("doc, says", [
    ({"buckets": []}, "no 'buckets' list"),
    ({"buckets": [{"seq_len": 24, "model": "tiny.onnx", "stats": "tiny.npz"}]}, "no 'plan'"),
    ({"buckets": [{"seq_len": 0, "model": "tiny.onnx", "stats": "tiny.npz", "plan": "hi.json"}]},
     "positive whole number"),
    ({"buckets": [{"seq_len": 24, "model": "tiny.onnx", "stats": "tiny.npz", "plan": "hi.json"},
                  {"seq_len": 24, "model": "tiny.onnx", "stats": "tiny.npz", "plan": "lo.json"}]},
     "seq_len 24 twice"),
    ({"buckets": [{"seq_len": 24, "model": "tiny.onnx", "stats": "tiny.npz", "plan": "x.json"}]},
     "does not exist"),
    ({"buckets": [{"seq_len": 24, "model": "tiny.onnx", "stats": "tiny.npz", "plan": "notarget.json"}]},
     "names no target"),
    ({"buckets": [{"seq_len": 24, "model": "tiny.onnx", "stats": "tiny.npz", "plan": "hi.json"},
                  {"seq_len": 64, "model": "tiny.onnx", "stats": "tiny.npz", "plan": "cpu.json"}]},
     "different targets"),
    ({"buckets": [{"seq_len": 24, "model": "other.onnx", "stats": "tiny.npz", "plan": "hi.json"}]},
     "same inputs and outputs"),
    ({"buckets": [{"seq_len": 24, "model": "tiny.onnx", "stats": "tiny.npz", "plan": "hi.json",
                   "batch": 2}]}, "unknown key 'batch'"),
])
def test_bad_deployments_are_one_line_and_write_nothing(setup, capsys, doc, says):
    tmp_path, *_ = setup
    write_plan(tmp_path / "notarget.json", Plan.uniform(Precision.A8_W8))
    write_plan(tmp_path / "cpu.json", Plan(default=Precision.A8_W8, target="ort-cpu"))
    onnx.save(tiny_encoder(outputs=("pooled",)), tmp_path / "other.onnx")
    dep = _deployment(tmp_path, doc["buckets"], "bad.json")
    out = tmp_path / "route.json"
    rc = main(["route", str(tmp_path / "tiny.onnx"), "--data", "stdlib-docs", "--pairs",
               str(PAIRS), "--deployment", str(dep), "--json", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and says in err[0], err
    assert not out.exists()


def test_route_refuses_data_without_token_counts(setup, tmp_path):
    _, model, data, stats, hi, lo = setup
    x = {"input_ids": np.ones((2, 5), np.int64), "attention_mask": np.ones((2, 5), np.int64)}
    np.savez(tmp_path / "t.npz", **x)
    tensors = stages.open_data(tmp_path / "t.npz", model)
    with pytest.raises(QuantscopeError, match="route needs text data"):
        evaluate_deployment(model, tensors, Deployment((Bucket(8, model, stats, lo),),
                                                       target=lo.target or ""))


def test_read_deployment_resolves_paths_beside_the_file_and_sorts(setup):
    tmp_path, *_ = setup
    dep = read_deployment(_deployment(tmp_path, [
        {"seq_len": 64, "model": "tiny.onnx", "stats": "tiny.npz", "plan": "lo.json"},
        {"seq_len": SHORT, "model": "tiny.onnx", "stats": "tiny.npz", "plan": "hi.json"}]))
    assert dep.seq_lens == (SHORT, 64)
    assert dep.buckets[0].plan.default is Precision.A16_W16


def test_report_shows_the_buckets(setup, capsys):
    tmp_path, *_ = setup
    dep = _deployment(tmp_path, [
        {"seq_len": SHORT, "model": "tiny.onnx", "stats": "tiny.npz", "plan": "hi.json"},
        {"seq_len": 64, "model": "tiny.onnx", "stats": "tiny.npz", "plan": "lo.json"}])
    (tmp_path / "out").mkdir()
    res, html = tmp_path / "out" / "route.json", tmp_path / "out" / "r.html"
    assert main(["route", str(tmp_path / "tiny.onnx"), "--data", "stdlib-docs", "--pairs",
                 str(PAIRS), "--deployment", str(dep), "--goal", "0.9", "--json",
                 str(res)]) == 0
    assert main(["report", "--results", str(res), "--out", str(html)]) == 0
    page = html.read_text()
    assert "Length buckets: route on" in page and 'alt="buckets"' in page
    assert "seq 64 alone" in page and ("MET" in page)
    assert "bucket 24: coverage:" in page  # each bucket's QDQ notes
