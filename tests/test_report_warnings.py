"""The run report's compiler-file warnings: a head-split model's script leaves a NOT SET
line per head and op (158 on minilm-l6), and the report printed every one of them under
the compiler files' table, a page and a half of lines before the first figure. The first
few are shown, the rest folded under one line that counts them."""

from __future__ import annotations

from quantscope.report.run import INLINE_WARNINGS, export_warnings_html


def test_many_warnings_fold_under_a_line_that_counts_them() -> None:
    warnings = [f"model.alls: head{i}/exp: a16_w16 NOT SET" for i in range(INLINE_WARNINGS + 3)]
    page = export_warnings_html(warnings)
    before, _, folded = page.partition("<details>")
    assert before.count("<p class=note>") == INLINE_WARNINGS
    assert f"3 more warnings ({INLINE_WARNINGS + 3} in all; verdict.json lists them)" in folded
    assert all(w in page for w in warnings)  # every one is still there


def test_a_few_warnings_are_shown_as_they_are() -> None:
    page = export_warnings_html(["one", "two"])
    assert page.count("<p class=note>") == 2 and "<details>" not in page
    assert export_warnings_html([]) == ""


def test_a_long_front_shows_its_key_rows_and_folds_the_rest() -> None:
    """minilm-l6's front has hundreds of predicted-only points: the report's table was a
    page of dashes before the measured ones."""
    from quantscope.report.run import FRONT_ROWS, pareto_section

    points = [{"cost": 1.0 + i / 100, "predicted": 5.0 + i / 10, "groups": {}} for i in range(40)]
    for i in (30, 39):
        points[i]["measured"] = 0.8 + i / 1000
    pareto = {"metric": "output_sqnr_db", "points": points,
              "chosen": {"cost": 1.39, "predicted": 8.9, "measured": 0.839}}
    page = pareto_section(pareto, "top1_agreement")
    shown, _, folded = page.partition("<details>")
    assert "All 40 points of the front" in folded and len(points) > FRONT_ROWS
    assert shown.count("<tr>") < FRONT_ROWS  # start, the measured and the chosen, the dearest
    assert ">31<" in shown and ">40<" in shown and ">1<" in shown
    # the chosen plan is not a front row here (it is the star): no empty marker column
    assert "<th></th>" not in shown


def test_a_routed_deployment_says_each_warning_once() -> None:
    """Each bucket's line repeated the same 600-character host-lookup warning (six times on
    minilm-l6's deployment); the line now names the rule, and the text is said once for
    the buckets it is on."""
    from quantscope.plan.deployment_results import RouteResult
    from quantscope.report.deployment import format_deployment

    warning = {"group": "Gather", "rule": "host.embedding", "reason": "the lookup runs on the host",
               "provenance": "p", "fix": "f", "severity": "info", "applies": True}
    bucket = {"cost_own": 2.0, "legal": True, "problems": [], "warnings": [warning],
              "files": {}, "model": "m.onnx", "texts": 5, "plan": {"default": "a8_w8"},
              "notes": []}
    doc = {"reference": "m.onnx", "data": "d", "target": "hailo10h", "metric": "top1_agreement",
           "deployment": "deployment.json", "seq_lens": [16, 32],
           "buckets": [{**bucket, "seq_len": 16, "cost": 0.5, "share": 0.5},
                       {**bucket, "seq_len": 32, "cost": 1.0, "share": 0.5}],
           "cost_mean": 0.75, "cost_max": 1.0, "legal": True,
           "metrics": {"top1_agreement": 0.9}, "notes": [],
           "longest_alone": {"seq_len": 32, "cost": 1.0, "metrics": {"top1_agreement": 0.9}}}
    text = format_deployment(RouteResult.from_dict(doc))
    assert text.count("the lookup runs on the host") == 1
    # an info problem is a note, as 'check' counts it (never a failure), not a warning
    assert "note (seq 16, 32): host.embedding: the lookup runs on the host" in text
    assert text.count("(1 note: host.embedding, below)") == 2 and "warning" not in text
    wide = {**warning, "rule": "hailo.maxpool_16bit", "severity": "warning", "reason": "16 bit"}
    doc["buckets"][1]["warnings"] = [warning, wide]
    text = format_deployment(RouteResult.from_dict(doc))
    assert "(1 warning: hailo.maxpool_16bit, below) (1 note: host.embedding, below)" in text
    assert "warning (seq 32): hailo.maxpool_16bit: 16 bit" in text


def test_a_plan_with_hundreds_of_changed_groups_is_counted_and_folded() -> None:
    """minilm-l6's head- and token-split plan sets 415 groups to a16_w16: the report listed
    every one, several pages, before the legality section."""
    from quantscope.report.run import CHANGED_ROWS, plan_diff_section

    groups = {f"g{i}": "a16_w16" for i in range(CHANGED_ROWS + 5)}
    groups["w"] = "a16_w8"
    page = plan_diff_section({"default": "a8_w8", "groups": groups, "reasons": {}})
    shown, _, folded = page.partition("<details>")
    assert f"<td>a8_w8 → a16_w16</td><td>{CHANGED_ROWS + 5}</td>" in shown
    assert "<td>a8_w8 → a16_w8</td><td>1</td>" in shown and "g3" not in shown
    assert f"All {CHANGED_ROWS + 6} groups set otherwise" in folded and "g3" in folded
    few = plan_diff_section({"default": "a8_w8", "groups": {"g0": "a16_w16"}, "reasons": {}})
    assert "g0" in few.partition("<details>")[0]  # a short plan is listed as it is


def test_no_quantized_io_says_so_instead_of_an_empty_table() -> None:
    """A model whose inputs and outputs are all uint8 (fed and read as they are) got the
    device I/O table's headers with no row under them."""
    from quantscope.report.build import io_section

    page = io_section([])
    assert "<table" not in page and "No model input or output is quantized" in page
    row = {"role": "input", "tensor": "x", "bits": 8, "signed": False, "scale": 0.5,
           "zero_point": 3}
    assert "<table" in io_section([row]) and "x_dev = round(x / 0.5) + 3" in io_section([row])


def test_check_phase_counts_an_info_problem_as_a_note() -> None:
    """'check --phase' on smollm2-135m printed '0 error(s), 1 warning(s)' for the host's
    word-embedding lookup, an info problem that check counts as a note (never a failure)."""
    from quantscope.plan.phases import PhaseCheck
    from quantscope.report.phase_plan import format_phase_checks
    from quantscope.types import Problem

    info = Problem(group="embed", rule="host.embedding", reason="on the host",
                   provenance="p", fix="f", severity="info")
    wide = Problem(group="n", rule="hailo.maxpool_16bit", reason="16 bit", provenance="p",
                   fix="f", severity="warning")
    (line, _), (both, *_) = (format_phase_checks((PhaseCheck("decode", 64, (info,), 0.71),)),
                             format_phase_checks((PhaseCheck("decode", 64, (info, wide),
                                                             0.71),)))
    assert "0 error(s), 0 warning(s), 1 note(s) (info: not a failure)" in line, line
    assert "0 error(s), 1 warning(s), 1 note(s)" in both, both
