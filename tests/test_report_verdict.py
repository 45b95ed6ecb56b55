"""The short verdict and the run report's sections, on hand-made stage files: one number
format, what binds as measured, the host steps, the Pareto front agreeing with the verdict,
handled findings folded, the sensitivity ranked by effect."""

import json
import re
from pathlib import Path

import pytest

from quantscope.pipeline.context import Context, RunOptions
from quantscope.pipeline.verdict import alls_files, export_warnings, format_verdict
from quantscope.report import fmt, run, summary
from quantscope.report.build import _table
from quantscope.report.summary import unset_line

WHATIF = {"metric": "top1_agreement", "note": "n", "plan": {"top1_agreement": 0.727},
          "kinds": [{"kind": "matmul", "groups": 12, "top1_agreement": 0.72, "gain": -0.0067},
                    {"kind": "weighted", "groups": 36, "top1_agreement": 0.757, "gain": 0.03}],
          "all": {"groups": 48, "top1_agreement": 0.8, "gain": 0.073}}
KINDS = {"q": "weighted", "k": "weighted", "att": "matmul"}


def _pareto(skipped):
    return {"skipped": [{"group": g, "precision": "a16_w16", "rules": [r], "gain": 0.1,
                         "severity": "error"} for g, r in skipped]}


def test_numbers_have_one_format_and_absent_values_a_dash():
    assert fmt.value("top1_agreement", 0.974) == "97.4 %"
    assert fmt.gain("top1_agreement", 0.03) == "+3.0 pts"
    assert fmt.value("sqnr_db", 17.61) == "17.6 dB" and fmt.gain("sqnr_db", -0.67) == "-0.7 dB"
    assert fmt.value("embedding_cosine_mean", 0.97312) == "0.9731"
    assert fmt.value("top1_agreement", None) == fmt.value("x", float("nan")) == "—"
    assert fmt.cost(1.40625) == "1.406x"
    page = _table(["a", "b"], [[None, float("nan")], ["None", 1.234567]])
    assert "None" not in page and "nan" not in page and page.count("<td>—</td>") == 3
    assert fmt.DASH_LEGEND in page  # a table with a dash says what it means
    assert fmt.DASH_LEGEND not in _table(["a"], [[1.0]])


def test_what_binds_is_what_the_whatif_measured_and_the_rule_only_its_reason():
    # the planner's binding rule is the attention rule, but the whatif measured Linears
    bm = summary.binds_measured(WHATIF, _pareto([("att", "hailo.attention_16bit"),
                                                 ("q", "hailo.super_defuse"),
                                                 ("k", "hailo.super_defuse")]), KINDS)
    assert bm["kind"] == "weighted" and bm["rule"] == "hailo.super_defuse"
    assert bm["sentence"].startswith("weighted layers (Linear/Conv) cost the most: +3.0 pts")
    assert "-0.7 pts" in bm["sentence"] and "hailo.super_defuse refuses lifting them" in \
        bm["sentence"]
    capped = summary.binds_measured(WHATIF, _pareto([("q", "max_cost")]), KINDS)
    assert "cost cap" in capped["sentence"] and "attention_16bit" not in capped["sentence"]
    assert summary.binds_measured(None, {}, {}) is None
    assert summary.binds_measured({"skipped": "no task"}, {}, {}) is None


def test_host_steps_for_token_inputs_token_states_and_symbolic_dims():
    ins = [{"name": "input_ids", "dtype": 7, "dims": ["batch", "seq"]},
           {"name": "attention_mask", "dtype": 7, "dims": ["batch", "seq"]}]
    outs = [{"name": "last_hidden_state", "dtype": 1, "dims": ["batch", "seq", 384]}]
    steps = summary.host_steps(ins, outs, text=True, seq_len=128)
    assert "input_ids, attention_mask" in steps[0] and "int64" in steps[0]
    assert "last_hidden_state is per token: mean-pool" in steps[1]
    assert "input_ids=1x128, attention_mask=1x128" in steps[2] and "batch, seq" in steps[2]
    # token inputs scored as plain tensors (no retrieval task): nothing was pooled, and the
    # verdict must not say it was
    raw = summary.host_steps(ins, outs, text=True, pooled=False, seq_len=128)
    assert "compared per token (no pooling" in raw[1] and "as the evaluation did" not in raw[1]
    fixed = [{"name": "x", "dtype": 1, "dims": [1, 3, 8, 8]}]
    assert summary.host_steps(fixed, [{"name": "y", "dtype": 1, "dims": [1, 4]}], text=False,
                              seq_len=None) == []


def _verdict(**kw):
    v = {"metric": "top1_agreement", "unit": "", "higher_is_better": True, "goal": 0.97,
         "reached": False, "uniform_meets_goal": False, "binding": "hailo.attention_16bit",
         "quality": {"fp32": {"top1_agreement": 1.0}, "a8_w8": {"top1_agreement": 0.61},
                     "plan": {"top1_agreement": 0.727}},
         "cost": 1.44, "legal": True, "rules_checked": 31, "rules_failed": [],
         "repairs": [], "rewrites_applied": [],
         "compiler_files": {"repaired.onnx": "a", "model.alls": "b", "quantized.qdq.onnx": "c"},
         "held_out": {"samples": 250, "unit": "pairs"},
         "binds_measured": summary.binds_measured(WHATIF, _pareto([("q", "max_cost")]), KINDS),
         "host_steps": ["feed input_ids", "pool", "fix dims"]}
    v.update(kw)
    return v


def test_the_console_verdict_is_short_and_leads_with_the_held_out_figure():
    lines = summary.format_short(_verdict())
    assert len(lines) <= 8 and sum(map(len, lines)) < 1200
    assert lines[0].startswith("verdict: goal top-1 agreement >= 97.0 % NOT reached")
    assert "72.7 % (n=250 held-out pairs; fp32 100.0 %; a8_w8 61.0 %)" in lines[0]
    assert lines[-1] == "  details: verdict.json, report.html"
    binds = next(line for line in lines if "binds" in line)
    assert "measured" in binds and "+3.0 pts" in binds
    assert "hailo.attention_16bit" not in "\n".join(lines)  # contradicted by the measurement
    assert any(line.startswith("  host: ") for line in lines)
    assert "binds: hailo.attention_16bit" in "\n".join(summary.format_short(
        _verdict(binds_measured=None)))  # without a whatif, the planner's binding
    assert "against uniform a8_w8 (chosen" not in "\n".join(lines)  # 72.7 % > 61.0 %
    worse = _verdict(quality={"a8_w8": {"top1_agreement": 0.875},
                              "plan": {"top1_agreement": 0.781}})
    assert "held out, the plan is -9.4 pts against uniform a8_w8" in summary.format_short(
        worse)[1]


PARETO = {"metric": "output_sqnr_db", "chosen": {"cost": 1.2, "predicted": 20.0,
                                                 "measured": 0.9},
          "points": [{"cost": 1.0, "predicted": 15.0, "measured": None, "groups": {},
                      "repairs": ["ranges", "bias"]},
                     {"cost": 1.2, "predicted": 20.0, "measured": 0.9, "groups": {"a": "x"},
                      "repairs": ["ranges", "bias"]}]}
REPAIRED = {"repairs": [{"name": "ranges", "skipped": None},
                        {"name": "bias", "skipped": "no measured gain"}]}


def test_the_pareto_section_marks_the_chosen_plan_and_its_repairs_as_applied():
    page = run.pareto_section(PARETO, "top1_agreement", verdict=_verdict(),
                              repaired_plan=REPAIRED)
    rows = re.findall(r"<tr>(.*?)</tr>", page)
    assert "<td>chosen</td>" in rows[2] and "ranges; skipped: bias (no measured gain)" in rows[2]
    assert "planned: ranges, bias" in rows[1]
    assert "front row 2" in page and "(fit)" in page and "n=250 held-out pairs" in page
    assert "None" not in page and "—" in page
    off = dict(PARETO, chosen={"cost": 1.1, "predicted": 18.0, "measured": 0.95})
    assert "not on the plotted front" in run.pareto_section(off, "top1_agreement")


ANALYSIS = {
    "low": "a8_w8", "high": "a16_w16", "primary": "sqnr_db",
    "method": {"rows": 64, "rows_per_sweep": {"enable_one": 8, "disable_one": 8}},
    "noise": [{"tensor": f"/model/encoder/layer.{i}/attention/self/Add_output_0",
               "sqnr_isolated_db": 0.0 if i == 1 else 30.0 - i,
               "sqnr_cumulative_db": 0.0 if i == 1 else 20.0 - i} for i in range(3)],
    "sensitivity": [{"group": g, "op_type": "MatMul", "enable_one": {"sqnr_db": 30.0},
                     "disable_one": {"sqnr_db": d}} for g, d in (("a", 5.0), ("b", 9.0),
                                                                 ("c", 7.0))],
    "outliers": [{"tensor": "/model/encoder/layer.1/attention/self/Add_output_0",
                  "group": None, "kind": "mask_range", "ratio": 8.9e37, "channels": [],
                  "bits_lost": 126.0, "reason": "mask"},
                 {"tensor": "t", "group": "g", "kind": "channels", "ratio": 40.0,
                  "channels": [3], "bits_lost": 5.3, "reason": "one channel"}],
}


def test_sensitivity_is_ranked_by_effect_and_masked_noise_explained():
    page = run.sensitivity_section(ANALYSIS)
    ranked = re.findall(r"<tr><td>\d+</td><td>(\w)</td>", page)
    assert ranked == ["b", "c", "a"]  # by disable-one effect, not graph order
    noise = run.noise_section(ANALYSIS)
    assert "masked attention-score" in noise and "0 dB" in noise
    assert "<td>masked</td>" in noise  # the table says so instead of printing 0 dB


def test_a_units_parts_are_one_sensitivity_row_under_the_units_name():
    parts = [{"group": f"x/tok{i}", "op_type": "Add", "enable_one": {"sqnr_db": 30.0},
              "disable_one": {"sqnr_db": 8.0}, "unit": "x/tok*", "unit_size": 3}
             for i in range(3)]
    page = run.sensitivity_section({**ANALYSIS, "sensitivity": [*ANALYSIS["sensitivity"],
                                                                *parts]})
    ranked = re.findall(r"<tr><td>\d+</td><td>([^<]+)</td>", page.replace("<wbr>", ""))
    assert ranked == ["b", "x/tok* (3 parts)", "c", "a"]


def test_handled_mask_outliers_are_one_line_and_a_folded_table():
    page = run.outliers_section(ANALYSIS, None)
    assert "1 attention-mask range(s), handled" in page
    head, folded = page.replace("<wbr>", "").split("<details>", 1)
    assert "Add_output_0" not in head  # the mask tensor only in the folded table
    assert "Add_output_0" in folded.split("</details>")[0]
    assert "1 tensor(s) with outlier channels" in page


def _lengths_doc(cost_mean=1.43, cap=1.5):
    bucket = {"texts": 67}
    return {"considered": True, "reason": "r", "deployment": {
        "kept_one": False, "seq_lens": [64, 128, 256], "models": 3, "reason": "buckets pay",
        "cost_per_query": 1.1, "cost_per_document": 1.7, "cost_mean": cost_mean,
        "cost_mean_se": 0.039, "switching": "switching between compiled models is not modelled",
        "cost_margin": {"cap": cap, "z": 2.0, "fit_mean": 1.40, "fit_se": 0.04, "bound": 1.48,
                        "budget": 1.44, "sentence": "chosen with a margin: fit mean cost ..."},
        "held_out": {"legal": True, "buckets": [bucket] * 3,
                     "metrics": {"top1_agreement": 0.98}}}}


def test_a_deployment_that_ships_is_the_headline_and_the_plan_a_detail():
    dep = summary.deployment(_lengths_doc(), "top1_agreement")
    v = _verdict(deployment=dep, reached=True, held_out={"samples": 100, "unit": "pairs"},
                 plan_cost=1.004, cost=None)
    v["headline"] = summary.headline(v)
    assert v["headline"]["ships"] == "deployment" and v["headline"]["value"] == 0.98
    assert v["headline"]["cost"] == 1.43 and v["headline"]["n"] == 100
    lines = summary.format_short(v)
    assert "98.0 % (n=100 held-out pairs; fp32 100.0 %; a8_w8 61.0 %)" in lines[0]
    assert "3 compiled models (64, 128, 256 tokens) at mean cost 1.430x held out" in lines[0]
    assert "72.7 %" not in lines[0]
    plan = next(x for x in lines if "single plan" in x)
    assert "72.7 % (n=100 held-out pairs) at 1.004x" in plan
    assert "within --max-cost 1.5" in "\n".join(lines)
    assert "len-64/, len-128/, len-256/: model.onnx + model.alls" in "\n".join(lines)
    over = summary.deployment(_lengths_doc(cost_mean=1.529), "top1_agreement")
    assert "OVER --max-cost 1.5 by 0.029x" in over["lines"][1]
    assert any(x.startswith("cost margin: chosen with a margin") for x in over["lines"])
    # no deployment measured: the plan ships and leads, as before
    alone = _verdict(plan_cost=1.44)
    assert summary.headline(alone)["ships"] == "plan"
    assert summary.format_short(alone)[0].endswith("(n=250 held-out pairs; fp32 100.0 %; "
                                                   "a8_w8 61.0 %)")


def test_the_short_verdict_counts_the_decisions_the_compiler_file_does_not_carry():
    """A real run's verdict (docs/data/run_verdict.json: minilm-l6, rewritten, no HN) has
    16-bit decisions on layers with no Hailo name: the console says how many, not only the
    details; without such warnings there is no line."""
    v = json.loads((Path(__file__).parent.parent / "docs" / "data" / "run_verdict.json")
                   .read_text())
    unset = [w for w in v["export_warnings"] if "NOT SET" in w]
    assert unset
    assert f"warning: {len(unset)} plan decision(s) NOT SET" in format_verdict(v)
    dep = {k: x for k, x in v["deployment"].items() if k != "as_scripted"}
    assert "NOT SET" not in format_verdict({**v, "export_warnings": [], "as_scripted": None,
                                            "deployment": dep})


def test_export_warnings_read_every_compiler_file_the_run_wrote(tmp_path):
    """The single plan's script and each compiled length's (deployment.json): each NOT SET
    line led by its file, the guessed names said once for all; the short verdict counts
    them per file and names the single plan's."""
    head = "# quantscope plan for hailo10h: default a8_w8\n# layer names: guessed by op order\n"
    unset = ("# a/exp: a16_w16 NOT SET: no Hailo layer name known for its Exp layer: give the "
             "HN parsed from this model or set it by hand\n")
    (tmp_path / "model.alls").write_text(head + unset + unset.replace("a/exp", "b/exp"))
    (tmp_path / "len-16").mkdir()
    (tmp_path / "len-16" / "model.alls").write_text(
        head + "# emb: a8_w8: runs on the host (a table lookup the target leaves outside the "
        "compiled graph): nothing to set\nquantization_param(conv1, precision_mode=a16_w16)\n")
    (tmp_path / "len-64").mkdir()
    (tmp_path / "len-64" / "model.alls").write_text(head + unset)
    (tmp_path / "deployment.json").write_text(json.dumps({"buckets": [
        {"seq_len": n, "model": f"len-{n}/model.onnx"} for n in (16, 64)]}))
    ctx = Context(RunOptions(model="m.onnx", data="stdlib-docs", target="hailo10h",
                             out=str(tmp_path)), tmp_path)
    assert alls_files(ctx) == ["model.alls", "len-16/model.alls", "len-64/model.alls"]
    got = export_warnings(ctx)
    assert [w.split(": ")[:2] for w in got[:3]] == [
        ["model.alls", "a/exp"], ["model.alls", "b/exp"], ["len-64/model.alls", "a/exp"]]
    assert got[3].startswith("model.alls, len-16/model.alls, len-64/model.alls: Hailo layer "
                             "names guessed by op order")
    line = unset_line(got, {"model.alls": "the single plan"})
    assert line is not None and "(model.alls (the single plan): 2, len-64/model.alls: 1)" in line


def test_the_short_verdict_gives_the_single_plan_as_its_script_carries_it():
    """Where model.alls leaves decisions NOT SET, the single plan measured without them is
    said under the warning; the goal is judged on it only when the plan ships."""
    v = json.loads((Path(__file__).parent.parent / "docs" / "data" / "run_verdict.json")
                   .read_text())
    sc = {"script": "model.alls", "decisions": 156, "value": 0.71, "plan": 0.873,
          "reached": False}
    text = format_verdict({**v, "as_scripted": sc})  # the real run's: 86.3 % (README)
    assert ("    the single plan as model.alls is written (156 groups NOT SET: precision to "
            "the default, range to the compiler's min/max): 71.0 % held out against its "
            "87.3 %\n") in text + "\n"
    alone = {k: x for k, x in v.items() if k != "deployment"}
    assert "the goal as scripted: MISSED" in format_verdict({**alone, "as_scripted": sc})
    assert "as model.alls is written" not in format_verdict({**v, "as_scripted": None})


def test_the_short_verdict_gives_the_deployment_as_its_scripts_carry_it():
    """What ships, measured as the compiled lengths' scripts are written: said under the
    warnings with the files, beside the deployment's figure, the goal judged on it."""
    v = json.loads((Path(__file__).parent.parent / "docs" / "data" / "run_verdict.json")
                   .read_text())
    assert v["deployment"]["as_scripted"]["value"] == pytest.approx(0.983, abs=1e-3)  # README
    sc = {"files": {"len-160/model.alls": 1, "len-256/model.alls": 1}, "decisions": 2,
          "value": 0.95}
    text = format_verdict({**v, "deployment": {**v["deployment"], "as_scripted": sc}})
    assert ("    the deployment as its scripts are written (2 groups NOT SET in "
            "len-160/model.alls, len-256/model.alls: precision to the default, range to the "
            "compiler's min/max): 95.0 % held out against its 98.7 %; the goal as scripted: "
            "MISSED\n") in text + "\n"
    dep = {k: x for k, x in v["deployment"].items() if k != "as_scripted"}
    assert "the deployment as its scripts" not in format_verdict({**v, "deployment": dep})
    alone = {k: x for k, x in v.items() if k != "deployment"}
    assert "the deployment as its scripts" not in format_verdict(alone)


def test_rules_that_warn_are_said_beside_legal():
    """On a target whose rules are warnings (hailo8) a plan that trips one is legal, and
    the verdict says which rule warns, how many groups, and when it may not apply."""
    from quantscope.pipeline.verdict import _warned, format_verdict_details

    problems = [
        {"rule": "hailo.attention_16bit", "severity": "warning", "applies": False},
        {"rule": "hailo.a16_low_sublayer_empty", "severity": "warning"},
        {"rule": "hailo.a16_low_sublayer_empty", "severity": "warning"},
        {"rule": "precision.not_allowed", "severity": "error"},
    ]
    assert _warned(problems) == ["hailo.a16_low_sublayer_empty (2 groups)",
                                 "hailo.attention_16bit (1 group, may not apply here)"]
    v = _verdict(rules_warned=_warned(problems[:1]))
    short = "\n".join(summary.format_short(v))
    assert ("legal: all 31 rules pass (warns: hailo.attention_16bit (1 group, may not apply "
            "here); check.json)") in short
    details = format_verdict_details({**v, "evaluation": "held out", "io": [], "io_note": "",
                                      "export_warnings": []})
    assert "warns: hailo.attention_16bit" in details
    assert "warns" not in "\n".join(summary.format_short(_verdict()))  # none: nothing said
