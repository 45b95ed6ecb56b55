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
