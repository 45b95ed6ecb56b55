"""Length buckets as typed values and named steps: ``quantscope route``'s RouteResult and
``quantscope buckets``' DeploymentChoice are what the commands write (byte for byte, and
read back), the choice is a pipeline of steps (legality asked of the picks only), the
solver is pure numpy, and text tasks say what routing needs of them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_route import PAIRS, SHORT, _candidates, _deployment, setup  # noqa: F401
from test_tasks_sts import _tsv

from quantscope import stages
from quantscope.cli import main
from quantscope.emulate.evaluate import kept, run_model
from quantscope.plan.buckets import solve_budget, solve_legal
from quantscope.plan.deployment import deployment_file
from quantscope.plan.deployment_results import DeploymentChoice, RouteResult
from quantscope.report.deployment import format_choice, format_deployment
from quantscope.serde import read_json, to_strict_json
from quantscope.stages import buckets as B
from quantscope.stages import route as R
from quantscope.tasks.registry import text_embeddings, text_task
from quantscope.types import QuantscopeError


def _dep_file(tmp_path: Path) -> Path:
    return _deployment(tmp_path, [
        {"seq_len": SHORT, "model": "tiny.onnx", "stats": "tiny.npz", "plan": "hi.json"},
        {"seq_len": 64, "model": "tiny.onnx", "stats": "tiny.npz", "plan": "lo.json"}])


def test_the_route_result_is_the_json_route_writes_and_reads_back(setup, capsys):  # noqa: F811
    tmp_path, model, data, *_ = setup
    dep = _dep_file(tmp_path)
    res = R.evaluate_deployment(model, data, R.read_deployment(dep))
    assert isinstance(res, RouteResult) and res.seq_lens == (SHORT, 64)
    res = res.with_verdict(R.deployment_verdict(res, max_cost=0.01, goal=0.5))
    assert res.verdict is not None and res.verdict.within_cost is False and not res.verdict.met
    out = tmp_path / "route.json"
    assert main(["route", str(tmp_path / "tiny.onnx"), "--data", "stdlib-docs", "--pairs",
                 str(PAIRS), "--deployment", str(dep), "--max-cost", "0.01", "--goal", "0.5",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    # the reference is opened from the file by the command: its name is the path
    res = RouteResult.from_dict({**res.to_dict(), "reference": str(tmp_path / "tiny.onnx")})
    assert to_strict_json(res.to_dict()) == out.read_text()
    assert RouteResult.from_dict(read_json(out, "route result")) == res
    assert format_deployment(res) in printed


def test_no_verdict_unless_asked_and_the_verdict_keys_are_those_asked(setup):  # noqa: F811
    tmp_path, model, data, *_ = setup
    res = R.evaluate_deployment(model, data, R.read_deployment(_dep_file(tmp_path)))
    assert R.deployment_verdict(res) is None and "verdict" not in res.to_dict()
    v = R.deployment_verdict(res, goal=0.0)
    assert v is not None and v.met and v.goal_met and v.short_by == 0.0
    assert list(v.to_dict()) == ["legal", "metric", "value", "goal", "goal_met", "short_by",
                                 "met"]
    # a lower-is-better metric is met at or below its goal (it was judged value >= goal)
    import dataclasses

    err = dataclasses.replace(res, metric="similarity_mae",
                              metrics={**res.metrics, "similarity_mae": 0.05})
    assert R.deployment_verdict(err, goal=0.1).goal_met is True
    low = R.deployment_verdict(err, goal=0.01)
    assert low.goal_met is False and low.short_by == pytest.approx(0.04)


def test_the_choice_is_the_json_buckets_writes_and_its_deployment_file(setup, capsys):  # noqa: F811
    tmp_path, model, data, *_ = setup
    cands, target = B.read_candidates(_candidates(tmp_path))
    choice = B.choose_deployment(model, data, cands, target, max_cost=10.0,
                                 seq_lens=(8, 16, SHORT, 64), max_buckets=3, skip_pairs=10)
    assert isinstance(choice, DeploymentChoice) and choice.buckets[-1].seq_len == 64
    (tmp_path / "out").mkdir()
    dep, js = tmp_path / "out" / "dep.json", tmp_path / "out" / "choice.json"
    assert main(["buckets", str(tmp_path / "tiny.onnx"), "--data", "stdlib-docs", "--pairs",
                 str(PAIRS), "--skip-pairs", "10", "--candidates", str(_candidates(tmp_path)),
                 "--max-cost", "10", "--lengths", f"8,16,{SHORT},64", "--max-buckets", "3",
                 "--out", str(dep), "--json", str(js)]) == 0
    printed = capsys.readouterr().out
    choice = DeploymentChoice.from_dict({**choice.to_dict(),
                                         "reference": str(tmp_path / "tiny.onnx")})
    assert to_strict_json(choice.to_dict()) == js.read_text()
    assert to_strict_json(deployment_file(choice, dep)) == dep.read_text()
    assert DeploymentChoice.from_dict(read_json(js, "choice")) == choice
    assert format_choice(choice) in printed


def test_legality_is_asked_of_the_picks_only(setup):  # noqa: F811
    tmp_path, model, data, *_ = setup
    cands, target = B.read_candidates(_candidates(tmp_path))
    lens = (8, 16, SHORT, 32, 64)
    sel = B.select_texts(model, data, cands, lens, 3, 0)
    assert sel.seq_lens == lens and len(sel.lengths) == 2 * PAIRS
    err = B.measure_errors(model, cands, sel)
    assert err.errors.shape == (2, 2 * PAIRS) and err.errors[0].mean() < err.errors[1].mean()
    costs = B.length_costs(model, cands, _target_of(cands), lens)
    alloc = B.allocate(cands, sel, err, costs, max_cost=10.0, max_buckets=3,
                       target_name=target)
    asked = set(alloc.legal)
    assert {(ci, j) for j, ci in alloc.picks} <= asked
    assert len(asked) < len(cands) * len(lens)  # not every (candidate, length)
    # the 16-bit candidate was refused at the lengths the test rule forbids, where asked
    assert all((not alloc.legal[(0, j)]) == (lens[j] <= SHORT) for (ci, j) in asked if ci == 0)


def _target_of(cands):
    from quantscope.targets import load_target

    return load_target(cands[0].plan.target)


def test_the_choice_steps_check_their_inputs_before_running_a_model(setup, tmp_path):  # noqa: F811
    _, model, data, *_ = setup
    cands, _ = B.read_candidates(_candidates(setup[0]))
    with pytest.raises(QuantscopeError, match="--max-buckets must be at least 1"):
        B.select_texts(model, data, cands, (16, 64), 0, 0)
    with pytest.raises(QuantscopeError, match="leaves no pair"):
        B.select_texts(model, data, cands, (16, 64), 2, PAIRS)
    np.savez(tmp_path / "t.npz", input_ids=np.ones((2, 5), np.int64),
             attention_mask=np.ones((2, 5), np.int64))
    with pytest.raises(QuantscopeError, match="buckets needs text data"):
        B.select_texts(model, stages.open_data(tmp_path / "t.npz", model), cands, (16,), 1, 0)


def test_solve_legal_forbids_illegal_picks_and_asks_only_about_picks():
    rng = np.random.default_rng(3)
    seq_lens = (8, 16, 32, 64)
    lengths = rng.integers(1, 90, 30)
    err = np.stack([rng.uniform(0, 0.1, 30), rng.uniform(0.2, 1, 30)])  # 0 better than 1
    costs = np.array([[1.0, 1.2, 1.5, 2.0], [0.2, 0.3, 0.5, 1.0]])
    illegal = {(0, 2), (0, 3)}  # candidate 0 not legal at 32 and 64
    asked: list[tuple[int, int]] = []

    def is_legal(ci: int, j: int) -> bool:
        asked.append((ci, j))
        return (ci, j) not in illegal

    got = solve_legal(lengths, err, costs, seq_lens, 3, 1.5 * 30, is_legal)
    assert got.picks and all((ci, j) not in illegal for j, ci in got.picks)
    assert not got.allowed[0, 3] and got.allowed[1].all()
    allowed = np.ones_like(costs, dtype=bool)
    allowed[0, 2:] = False
    assert list(got.picks) == solve_budget(lengths, err, costs, allowed, seq_lens, 3,
                                           1.5 * 30)[1]
    assert len(set(asked)) < costs.size


def test_text_tasks_say_what_routing_needs(setup, tmp_path):  # noqa: F811
    _, model, data, *_ = setup
    task = text_task(data.task)
    assert task is not None and task.n_pairs == PAIRS
    np.savez(tmp_path / "t.npz", input_ids=np.ones((2, 5), np.int64),
             attention_mask=np.ones((2, 5), np.int64))
    assert text_task(stages.open_data(tmp_path / "t.npz", model).task) is None
    sts = text_task(stages.open_data(str(_tsv(tmp_path / "p.tsv")), model).task)
    assert sts is not None and sts.n_pairs == 6
    assert sts.selection_figures(np.eye(12), np.eye(12)) == {}
    # the task cut to some texts embeds them as the whole task does
    rows = np.array([1, 4, 7, PAIRS + 1, PAIRS + 4])
    cut = task.only_texts(rows)
    assert len(cut.batches.order) == len(rows)

    def emb(t):
        b = tuple(t.batches.batches)
        return text_embeddings(t, kept(run_model(model.proto, b), b, t.keep))

    np.testing.assert_allclose(emb(cut), emb(task)[rows], rtol=0, atol=1e-6)
    figs = task.selection_figures(emb(task), emb(task))
    assert figs["top1_agreement"] == 1.0 and figs["recall@1"] == figs["recall@1_fp32"]


def test_the_old_names_give_the_dict_forms(setup):  # noqa: F811
    from quantscope import stages_route

    tmp_path, model, data, *_ = setup
    dep = stages_route.read_deployment(_dep_file(tmp_path))
    d = stages_route.evaluate_deployment(model, data, dep)
    assert d == R.evaluate_deployment(model, data, dep).to_dict()
    assert stages_route.deployment_verdict(d, goal=0.5) == R.deployment_verdict(
        RouteResult.from_dict(d), goal=0.5).to_dict()
    assert json.loads(to_strict_json(d))["seq_lens"] == [SHORT, 64]
