"""Shares read the same in every human-facing text: percent with one decimal, standard
errors in points, JSON 0-1 (h17)."""

from __future__ import annotations

from quantscope.report import fmt


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
    missed = goal_verdict({"chosen": {"measured": 0.9}, "blockers": [
        {"rule": "hailo.x", "groups": ["a"], "gain": 0.5}]}, "top1_agreement", 0.9725)
    assert missed["verdict"].startswith(
        "goal top-1 agreement >= 97.25 % NOT reached: best legal plan 90.0 %;")
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
