"""The auto choice's reasons and progress lines write a share in percent and its gain in
points (``run`` printed "gain +0.03, one-sided 95% bounds [+0.01034, +0.04966]" and
"top1_agreement 0.8 -> 0.81" where every other line says 97.4 %), a figure in dB in dB."""

from __future__ import annotations

from quantscope.rewrites import auto


def test_a_paired_interval_is_written_in_the_metrics_unit() -> None:
    iv = {"difference": 0.03, "lower": 0.01034, "upper": 0.04966, "n": 300,
          "confidence": 0.95}
    assert auto._interval_text(iv, "top1_agreement") == (
        "gain +3.00 pts, one-sided 95% bounds [+1.03 pts, +4.97 pts] over n=300 paired samples")
    assert "gain +0.030 dB" in auto._interval_text(iv, "embedding_sqnr_db")


def test_a_trial_line_writes_its_figures_in_percent(capsys) -> None:
    trial = auto.Trial("rowscale", tried=True, kept=True, reason="why", before=0.8,
                       after=0.81)
    auto._say_trial(trial, "top1_agreement", 300, True)
    assert "(top1_agreement 80.0 % -> 81.0 %, n=300)" in capsys.readouterr().err


def test_a_tiny_difference_keeps_two_significant_digits() -> None:
    """A non-zero difference too small for the unit's decimals read "+0.0 pts", as if
    there were none; only an exact 0 reads as no difference now."""
    from quantscope.units import gain

    assert gain("top1_agreement", 0.0001) == "+0.010 pts"
    assert gain("top1_agreement", 0.0) == "+0.0 pts"
    assert gain("sqnr_db", -0.0004) == "-0.00040 dB"
    assert gain("sqnr_db", 1e-9, fine=True) == "+0.000000 dB"  # below a millionth: no digit
    assert gain("top1_agreement", 0.03) == "+3.0 pts"
