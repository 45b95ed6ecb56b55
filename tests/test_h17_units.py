"""Shares read the same in every human-facing text: percent with one decimal, standard
errors in points, JSON 0-1 (h17)."""

from __future__ import annotations

import numpy as np

from quantscope.report import fmt
from quantscope.types import Outputs


def test_a_small_standard_error_is_not_printed_as_zero() -> None:
    # 0.0003 of a share is 0.03 points: "± 0.0 pts" read as no error at all
    assert fmt.spread("top1_agreement", 0.0003) == "0.030 pts"
    assert fmt.with_se("decode_top1", 0.9743, 0.00049) == "97.4 % ± 0.049 pts"
    assert fmt.spread("greedy_agreement", 0.012) == "1.2 pts"
    assert fmt.spread("top1_agreement", 0.0) == "0 pts"  # exactly none
    assert fmt.spread("kl", 0.000012) == "0.000012"  # not 0.0000, not 1.2e-05
    assert fmt.spread("kl", 0.004) == "0.0040"


def test_a_goal_reads_in_the_metrics_unit():
    from quantscope.stages import goal_verdict

    # it read "goal top1_agreement >= 0.97 reached: 0.9743"
    done = goal_verdict({"chosen": {"measured": 0.9743}}, "top1_agreement", 0.97)
    assert done["verdict"] == "goal top-1 agreement >= 97.0 % reached: 97.4 %"
    missed = goal_verdict({"chosen": {"measured": 0.9}, "metric": "output_sqnr_db", "blockers": [
        {"rule": "hailo.x", "groups": ["a"], "gain": 2.84}]}, "top1_agreement", 0.9725)
    assert missed["verdict"] == (
        "goal top-1 agreement >= 97.25 % NOT reached: best legal plan 90.0 %; binding: "
        "hailo.x blocks 1 promotion(s) worth +2.8 dB predicted (in the analysis' metric)")
    on_task = goal_verdict({"chosen": {"measured": 0.9}, "metric": "top1_agreement", "blockers": [
        {"rule": "hailo.x", "groups": ["a"], "gain": 0.031}]}, "top1_agreement", 0.95)
    assert on_task["verdict"].endswith("worth +3.1 pts predicted (in the analysis' metric)")
    db = goal_verdict({"chosen": {"measured": 31.26}}, "sqnr_db_channel_min", 30.0)
    assert db["verdict"] == "goal worst-channel SQNR >= 30.0 dB reached: 31.3 dB"
    assert fmt.goal("similarity_mae", 0.1, higher=False) == "similarity mae <= 0.1"
    assert fmt.budget("top1_agreement", {"min_quality": 0.97, "max_cost": 1.5}) == \
        "goal top-1 agreement >= 97.0 %, cost <= 1.5x"


def test_the_decoder_search_reasons_write_shares_in_points() -> None:
    from quantscope.pipeline.decoder_search import Figure, eliminate

    figures = {("rotate", "smooth"): (0.80, 0.0003), ("smooth",): (0.70, 0.01),
               ("rotate",): (0.8003, 0.0004)}

    def measure(steps):
        v = figures[steps]
        return Figure(v[0], v[1], {"prefill": 1.4, "decode": 1.2}, "act16")

    s = eliminate(("rotate", "smooth"), measure, metric="top1_agreement", higher=True,
                  free=lambda steps: None)
    # it read "kept: better with it by 0.1, more than one standard error of the difference
    # (0.01); top1_agreement 0.8 (± 0.0003) with it, 0.7 (± 0.01) without"
    assert s.decisions["rotate"] == (
        "kept: better with it by 10.0 pts, more than one standard error of the difference "
        "(1.0 pts); top1_agreement 80.0 % (± 0.030 pts) with it, 70.0 % (± 1.0 pts) without")
    assert s.decisions["smooth"].startswith(
        "dropped: worse with it by 0.030 pts; top1_agreement 80.0 % (± 0.030 pts) with it")


def test_the_decoder_plan_table_writes_shares_in_percent() -> None:
    from quantscope.stages_llm import format_lm_quality  # plan --phase and plan.txt

    row = {"top1_agreement": 0.9743, "top1_agreement_se": 0.0112, "kl": 0.0123,
           "kl_se": 0.0012, "ppl_ratio": 1.0321, "ppl_ratio_se": 0.004, "positions": 512}
    result = {"prefix": None, "setup": {"new_tokens": 16}, "plans": {"act16": {
        "prefill": row, "decode_fp32_kv": {**row, "top1_agreement_se": 0.0003},
        "decode_emu_kv": {k: v for k, v in row.items() if k != "top1_agreement_se"},
        "greedy": {"greedy_agreement": 0.75, "greedy_agreement_se": 0.125, "prompts": 4}}}}
    lines = format_lm_quality(result)
    # it read "act16  prefill  0.974  0.0123  1.0321  (±0.011, ±0.0012, ±0.0040; 512)"
    assert lines[2] == ("act16          prefill           97.4 %    0.0123     1.0321   "
                        "(± 1.1 pts, ± 0.0012, ± 0.0040; 512)"), lines[2]
    assert "(± 0.030 pts, ± 0.0012" in lines[3]
    assert "(± —, ± 0.0012" in lines[4]  # not recorded: a dash, not ±0
    assert lines[5] == "act16          greedy (16 tok)   75.0 %   (± 12.5 pts; 4 prompts)"


def _drawn(monkeypatch, module: str, name: str = "png_uri") -> list:
    """The figures a report module draws (each still whole: its axes, bars, lines), kept
    instead of encoded."""
    import importlib

    kept: list = []
    monkeypatch.setattr(importlib.import_module(module), name,
                        lambda fig: kept.append(fig) or "data:")
    return kept


def _fig(value: float, se: float) -> dict:
    return {"value": value, "se": se}


def test_the_decoder_report_plots_draw_shares_in_percent(monkeypatch) -> None:
    from quantscope.report import decoder

    drawn = _drawn(monkeypatch, "quantscope.report.decoder")
    figures = {"ppl_ratio": _fig(1.05, 0.004), "top1_agreement": _fig(0.931, 0.011),
               "decode_top1": _fig(0.901, 0.021), "greedy_agreement": _fig(0.75, 0.05)}
    verdict = {"figures": figures, "metric": "top1_agreement", "goal": 0.9, "w4": {}}
    decoder.figures_plot(verdict)
    axes = {ax.get_title(): ax for ax in drawn[0].axes}
    # they drew 0.931 on an axis titled "prefill top-1" while the tables say 93.1 %
    top1 = axes["prefill top-1 (%)"]
    assert [round(p.get_height(), 6) for p in top1.patches] == [93.1]
    assert [round(y, 6) for y in top1.get_lines()[-1].get_ydata()] == [90.0, 90.0]  # goal
    caps = [y for line in top1.get_lines()[:-1] for y in line.get_ydata()]  # ± 2 SE
    assert sorted(round(y, 6) for y in caps) == [90.9, 95.3]
    assert [round(p.get_height(), 6) for p in axes["prefill perplexity ratio"].patches] == [1.05]
    assert "greedy matched prefix (%)" in axes and "decode top-1 (emulated KV) (%)" in axes
    w = {"setup": {"evaluation": 4, "steps": 8}, "max_cost": 1.5, "variants": [
        {"label": "plan", "what": "the plan", "figures": figures, "costs": {"prefill": 1.4},
         "ships": True, "rules": []}]}
    decoder.whatif_section(w, verdict)
    axes = {ax.get_title(): ax for ax in drawn[1].axes}
    assert [round(p.get_width(), 6) for p in axes["decode top-1 (emulated KV) (%)"].patches] \
        == [90.1]


def test_the_run_report_plots_draw_shares_in_percent(monkeypatch) -> None:
    from quantscope.report import plots

    drawn = _drawn(monkeypatch, "quantscope.report.plots", "_png")
    plots.headroom_plot("top1_agreement", 0.93, {"goal": 0.97, "needed": 0.5, "rows": [
        {"scale": 0.5, "top1_agreement": 0.97}, {"scale": 0.25, "top1_agreement": 0.99}]})
    ax = drawn[0].axes[0]
    assert ax.get_ylabel() == "top1_agreement (%)"
    assert [round(y, 6) for y in ax.get_lines()[0].get_ydata()] == [93.0, 97.0, 99.0]
    pareto = {"metric": "output_sqnr_db", "points": [
        {"cost": 1.0, "predicted": 20.0, "measured": 0.91},
        {"cost": 1.3, "predicted": 25.0, "measured": 0.95}], "chosen": {"cost": 1.3,
                                                                      "measured": 0.95}}
    plots.pareto_plot(pareto, "top1_agreement")
    left, right = drawn[1].axes
    assert left.get_ylabel() == "predicted output_sqnr_db"  # dB stays dB
    assert right.get_ylabel() == "measured top1_agreement (%)"
    assert [round(y, 6) for y in right.get_lines()[0].get_ydata()] == [91.0, 95.0]
    plots.sensitivity_plot([{"group": "g", "enable_one": {"top1_agreement": 0.8},
                             "disable_one": {"top1_agreement": 0.9}}], "top1_agreement")
    ax = drawn[2].axes[0]
    assert ax.get_xlabel() == "top1_agreement (%)"
    assert sorted(round(p.get_width(), 6) for p in ax.patches) == [80.0, 90.0]
    from quantscope.report import build

    drawn = _drawn(monkeypatch, "quantscope.report.build", "_png")
    build.plan_section({"target": "hailo8", "default": "a8_w8", "groups": {}, "pareto": {
        **pareto, "measured_metric": "top1_agreement"}})
    left, right = drawn[0].axes
    assert (left.get_ylabel(), right.get_ylabel()) == ("output_sqnr_db",
                                                        "measured task metric (%)")
    assert [round(y, 6) for y in right.get_lines()[0].get_ydata()] == [91.0, 95.0]


def _outputs(name: str, arr: np.ndarray) -> Outputs:
    return Outputs(names=(name,), batches=((arr.astype(np.float32),),))


def test_the_tasks_notes_write_shares_in_percent() -> None:
    from quantscope.tasks.classes import ClassTask
    from quantscope.tasks.detection import DetectionLayout, DetectionTask
    from quantscope.tasks.maps import ScoreTask
    from quantscope.tasks.metrics import resemblance_note

    ref = np.eye(4)[[0, 1, 2, 3, 0, 1, 2, 3]] + 0.1
    test = np.eye(4)[[0, 1, 2, 3, 1, 2, 3, 0]] + 0.1  # 4 of 8 top classes change
    m = ClassTask(name="c", output="y").metrics(_outputs("y", ref), _outputs("y", test))
    # it read "(top-1 agreement 0.500 < 0.9)"
    assert any("(top-1 agreement 50.0 % < 95.0 %)" in n for n in m.notes), m.notes
    p = np.array([0.9, 0.8, 0.2, 0.1])
    s = ScoreTask(name="s", output="p").metrics(_outputs("p", p), _outputs("p", 1 - p))
    assert any("(agreement 0.0 % < 95.0 %)" in n for n in s.notes), s.notes
    a = 3
    boxes = np.stack([20.0 * np.arange(a) + 5, np.full(a, 5.0), np.full(a, 10.0),
                      np.full(a, 10.0)])
    ref_d = np.concatenate([boxes, [[0.9, 0.1, 0.6], [0.1, 0.8, 0.1]]])[None]
    test_d = np.concatenate([boxes, [[0.9, 0.1, 0.1], [0.1, 0.1, 0.7]]])[None]
    d = DetectionTask(name="d", output="det", layout=DetectionLayout()).metrics(
        _outputs("det", ref_d), _outputs("det", test_d))
    # it read "detections F1 0.400 vs FP32 (recall 0.333, …) < 0.9"
    assert any("detections F1 40.0 % vs FP32 (recall 33.3 %, 2 kept vs FP32's 3) < 90.0 %"
               in n for n in d.notes), d.notes
    note = resemblance_note(0.95, agreement=0.004, candidates=1000)
    assert "top-1 agreement with FP32 0.4 % is near chance (0.1 %)" in note, note
    from quantscope.emulate.channels import ScalarFidelity

    f = ScalarFidelity()
    f.add(np.array([0.9, 0.8, 0.2, 0.1, 0.7], np.float32),
          np.array([0.9, 0.8, 0.2, 0.6, 0.7], np.float32))
    line = f.notes("p")[0][0]
    assert "; 80.0 % of samples decided as FP32 at threshold 0.5" in line, line


def test_the_demo_console_table_writes_shares_in_percent() -> None:
    from quantscope.demo import format_table

    metrics = {"recall@1": 0.389, "top1_agreement": 0.974, "embedding_cosine_mean": 0.99123,
               "embedding_cosine_min": 0.9, "norm_cv": 0.05, "collapsed": False}
    row = format_table({"a8_w8": {"metrics": metrics}}).splitlines()[2]
    # it read "0.389  97.4%": recall@1 0-1 beside a percent without its space
    assert row.split()[1:5] == ["38.9", "%", "97.4", "%"], row
    assert "0.9912" in row


def test_a_dropped_fine_tune_says_its_figures_in_their_metric() -> None:
    from quantscope.stages import _keep_finetune

    # the record names no metric: the figures are the plan's measured metric, not the
    # analysis' (output_sqnr_db: it read "measured 0.85 with finetune against 0.9 without")
    worse = {"chosen": {"measured": 0.9}, "metric": "output_sqnr_db",
             "measured_metric": "top1_agreement",
             "finetune": {"before": 0.8, "after": 0.85, "skipped": None}}
    assert not _keep_finetune(worse)
    assert worse["finetune"]["dropped"].startswith(
        "measured 85.0 % with finetune against 90.0 % without")


def test_a_repair_offer_says_its_measurements_in_their_units() -> None:
    import tiny_models
    from test_repair_split import residual_block

    from quantscope.calibrate.collect import calibrate
    from quantscope.model.groups import find_groups
    from quantscope.stages import Dataset, evaluate_plan, plan_repair_offer
    from quantscope.targets import load_target
    from quantscope.tasks.classes import ClassTask
    from quantscope.types import Plan, Precision, Sensitivity

    model = residual_block()
    feeds = tuple(tiny_models.sample_inputs(model.proto, seed=i) for i in range(3))
    data = Dataset("tiny", calibration=feeds, evaluation=feeds,
                   task=ClassTask(name="c", output="out"))  # a class per position
    stats = calibrate(model, find_groups(model), iter(feeds))
    target = load_target("ort-cpu")
    low = Plan(default=Precision.A8_W8, target=target.name)
    base = evaluate_plan(model, data, stats, low, scheme=target.scheme)["metrics"]
    sens = Sensitivity.from_gains("sqnr_db", base["sqnr_db"], {
        g: {"a16_w16": 1.0} for g in find_groups(model).names()})
    offer = plan_repair_offer(model, data, stats, sens, target, ("split",), list(feeds),
                              task_metric="top1_agreement")
    row = {r["name"]: r for r in offer.measured}["split"]
    before, after = row["top1_agreement"]
    # it read "sqnr_db 11.37 -> 18.5, top1_agreement 0.8275 -> 0.9217"
    assert (f"top1_agreement {100 * before:.1f} % -> {100 * after:.1f} %"
            in offer.options[0].reason), offer.options[0].reason
    assert f"sqnr_db {row['sqnr_db'][0]:.1f} dB -> " in offer.options[0].reason
