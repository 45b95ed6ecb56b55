"""``run <decoder> --rewrites search`` (pipeline/decoder_search.py): the recipe's steps chosen
by measurement, backward from the whole recipe; on the tiny decoder and on made-up figures."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from decoder_tiny import AMOUNTS, SEQ, byte_decoder
from decoder_tiny import run_cli as _run
from tiny_models import residual_add

from quantscope import stages_llm
from quantscope.cli import main
from quantscope.pipeline import decoder_search
from quantscope.pipeline.decoder_search import Figure, eliminate
from quantscope.types import QuantscopeError

RECIPE = ("rotate", "smooth", "gatedsplit")  # the made-up figures' steps
FULL = decoder_search.searched(stages_llm.RECIPE)  # what a searched run starts from


def _fake(values: dict[tuple[str, ...], tuple[float, float] | None]):
    """``measure`` and ``free`` over made-up figures (None: that set cannot be planned),
    with the calls each received."""
    asked, freed = [], []

    def measure(steps):
        asked.append(steps)
        v = values[steps]
        if v is None:
            raise QuantscopeError("no candidate is legal")
        return Figure(v[0], v[1], {"prefill": 1.4, "decode": 1.2}, "act16")

    return measure, freed.append, asked, freed


def test_a_step_is_kept_only_when_better_beyond_one_standard_error() -> None:
    # perplexity ratio, lower is better: rotate's removal costs 0.05 (SE of the
    # difference 0.014: kept); smooth's removal costs 0.005 (within: dropped, a tie);
    # gatedsplit's removal (from rotate, gatedsplit) costs nothing (dropped)
    full, no_rot, no_smooth = RECIPE, ("smooth", "gatedsplit"), ("rotate", "gatedsplit")
    measure, free, asked, freed = _fake({
        full: (1.10, 0.01), no_rot: (1.15, 0.01), no_smooth: (1.105, 0.01),
        ("rotate",): (1.104, 0.01)})
    s = eliminate(RECIPE, measure, metric="ppl_ratio", higher=False, free=free)
    assert asked == [full, no_rot, no_smooth, ("rotate",)]
    assert s.chosen == ("rotate",)
    assert s.decisions["rotate"].startswith("kept: better with it by 0.05")
    assert "a tie, fewer steps" in s.decisions["smooth"]
    assert s.decisions["gatedsplit"].startswith("dropped: worse with it by 0.001")
    # each trial's files freed once it is not the incumbent; the kept one's are not
    assert freed == [no_rot, full, no_smooth]
    assert [t.kept for t in s.trials] == [False, False, False, True]
    d = s.to_dict()
    assert d["chosen"] == ["rotate"] and d["measured_by"] == "onnxruntime"
    assert [t["figure"]["value"] for t in d["trials"]] == [1.10, 1.15, 1.105, 1.104]


def test_higher_is_better_and_a_set_that_cannot_be_planned_keeps_its_step() -> None:
    full = RECIPE
    measure, free, asked, _ = _fake({
        full: (0.80, 0.01), ("smooth", "gatedsplit"): None,
        ("rotate", "gatedsplit"): (0.70, 0.01), ("rotate", "smooth"): (0.81, 0.01)})
    s = eliminate(RECIPE, measure, metric="top1_agreement", higher=True, free=free)
    assert s.chosen == ("rotate", "smooth")
    assert "could not be planned (no candidate is legal)" in s.decisions["rotate"]
    assert s.decisions["smooth"].startswith("kept") and "worse with it" in s.decisions[
        "gatedsplit"]
    assert s.trials[1].figure is None and not s.trials[1].kept and s.trials[-1].kept
    # every step dropped: the given graphs (no step), the last trial
    measure, free, asked, _ = _fake({
        full: (0.80, 0.01), ("smooth", "gatedsplit"): (0.80, 0.01),
        ("gatedsplit",): (0.80, 0.01), (): (0.80, 0.01)})
    assert eliminate(RECIPE, measure, metric="top1_agreement", higher=True,
                     free=free).chosen == ()
    assert asked[-1] == ()
    measure, free, _, _ = _fake({full: None})
    with pytest.raises(QuantscopeError, match="the recipe .* could not be planned"):
        eliminate(RECIPE, measure, metric="top1_agreement", higher=True, free=free)


@pytest.fixture
def searched(searched_decoder) -> tuple:
    return searched_decoder  # conftest: one searched run for the session


def _plan_figure(out) -> float:
    meta = dict(json.loads((out / "plan.json").read_text())["meta"])
    return json.loads(meta["phase_results"])["quality"]["prefill"]["ppl_ratio"]


def test_search_records_its_trials_and_the_later_stages_read_its_choice(searched) -> None:
    out, printed, _ = searched
    doc = json.loads((out / "rewrite.json").read_text())
    search = doc["search"]
    trials = search["trials"]
    assert len(trials) >= 2 and trials[0]["steps"] == list(FULL)
    assert all(t["figure"]["value"] > 0 and t["figure"]["se"] > 0 for t in trials)
    assert all(set(t["figure"]["costs"]) == {"prefill", "decode"} and
               max(t["figure"]["costs"].values()) <= 1.5 for t in trials)
    kept = [t for t in trials if t["kept"]]
    assert len(kept) == 1 and kept[0]["steps"] == doc["rewrites"] == search["chosen"]
    assert set(search["decisions"]) == set(FULL) and search["measured_by"] == "onnxruntime"
    # the plan stage planned the chosen graphs: its figure is the kept trial's (same
    # graphs, same amounts, same calibration windows)
    assert _plan_figure(out) == pytest.approx(kept[0]["figure"]["value"], rel=1e-9)
    assert (out / "model").is_dir() == bool(doc["rewrites"])
    assert not (out / decoder_search.TRIALS).exists()  # the trials' files are gone
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["rewrites"] == doc["rewrites"] and verdict["rewrite_search"] == search
    assert "(chosen by --rewrites search)" in printed and "measured by onnxruntime" in printed
    for t in trials:
        assert f"{t['figure']['value']:.4f} (± {t['figure']['se']:.4f})" in printed
    page = (out / "report.html").read_text()
    assert "<h2>Rewrites searched</h2>" in page and "backward elimination" in page


def test_a_rerun_does_not_redo_the_trials(searched, capsys) -> None:
    out, _, args = searched
    before = (out / "rewrite.json").read_bytes()
    code = main(args)
    said = capsys.readouterr()
    assert code == 0 and "stages run: none" in said.out and "search: trial" not in said.err
    assert (out / "rewrite.json").read_bytes() == before


def test_search_keeping_steps_hands_their_graphs_to_the_plan(tmp_path, monkeypatch) -> None:
    """With a margin no figure can miss every step is kept: ``model/`` holds the whole
    recipe's graphs (their rewrite records) and the plan stage's figure is trial 1's."""
    from quantscope.rewrites.phases import weight_digests
    from quantscope.rewrites.registry import applied_rewrites
    from quantscope.stages_llm import recipe_phase_files

    monkeypatch.setattr(decoder_search, "MARGIN_SE", -1e9)
    model = byte_decoder(tmp_path)
    out = tmp_path / "run"
    code, _ = _run(["run", str(model), "--data", "stdlib-docs", "--target", "hailo10h",
                    "--seq-len", str(SEQ), "--rewrites", "search", "--w4", "off", *AMOUNTS,
                    "--out", str(out)])
    assert code == 0
    doc = json.loads((out / "rewrite.json").read_text())
    assert doc["rewrites"] == list(FULL) and doc["search"]["trials"][0]["kept"]
    assert len(doc["search"]["trials"]) == len(FULL) + 1 and set(doc["notes"]) == set(FULL)
    # the graphs the later stages read are the whole recipe's, as the default run makes them
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    recipe_phase_files(model, FULL, fresh / "m.prefill.onnx", seq_len=SEQ, prefix="auto",
                       target="hailo10h")
    for phase in ("prefill", "decode"):
        got = onnx.load(str(out / "model" / f"model.{phase}.onnx"))
        want = onnx.load(str(fresh / f"m.{phase}.onnx"))
        assert weight_digests(got) == weight_digests(want), phase
        assert len(got.graph.node) == len(want.graph.node) and "rotate" in applied_rewrites(got)
    assert _plan_figure(out) == pytest.approx(doc["search"]["trials"][0]["figure"]["value"],
                                              rel=1e-9)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("rewrite")) == [
        "rewrite.json"]


def test_search_is_a_decoders_option(tmp_path, capsys) -> None:
    """On an encoder ``--rewrites search`` is one line naming ``auto`` (its own choice by
    measurement); a decoder's options refuse any other word."""
    from quantscope.pipeline.decoder import DecoderOptions

    onnx.save(residual_add(), tmp_path / "enc.onnx")
    np.savez(tmp_path / "x.npz", x=np.ones((4, 8), np.float32))
    assert main(["run", str(tmp_path / "enc.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--target", "hailo10h", "--rewrites", "search", "--out",
                 str(tmp_path / "W")]) == 2
    err = capsys.readouterr().err
    assert "--rewrites search chooses a decoder LLM's recipe steps" in err
    assert "--rewrites auto" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "W").exists()
    searched = DecoderOptions("m", "hailo10h", "o", search=True)
    searched.check()
    assert searched.rewrites == FULL and searched.rewrite_search is not None
    assert DecoderOptions("m", "hailo10h", "o").rewrites == ("gatedsplit",)  # the default
    assert DecoderOptions("m", "hailo10h", "o").rewrite_search is None
    with pytest.raises(QuantscopeError, match="--rewrites searching is an encoder rewrite"):
        DecoderOptions("m", "hailo10h", "o", rewrites=("searching",)).check()
