"""Promotions ranked by the task when the analysis scored every candidate with it."""

from quantscope.serde import sensitivity_from_dict
from quantscope.types import Precision


def _analysis(primary, with_task=True):
    def m(top1, sqnr):
        out = {"sqnr_db": sqnr, "cosine_mean": 0.9}
        if with_task:
            out[primary] = top1
        return out
    return {
        "format": "quantscope.analysis/1", "low": "a8_w8", "high": "a16_w16",
        "primary": primary, "higher_is_better": True, "method": {"rows": 2000},
        "baselines": {"a8_w8": m(0.50, 10.0), "a16_w16": m(0.99, 40.0)},
        # g1 recovers the most SQNR, g2 the most top-1 agreement
        "sensitivity": [
            {"group": "g1", "op_type": "Add", "enable_one": m(0.9, 30), "disable_one": m(0.52, 14.0)},
            {"group": "g2", "op_type": "MatMul", "enable_one": m(0.9, 30), "disable_one": m(0.61, 11.0)},
            {"group": "g3", "op_type": "MatMul", "enable_one": m(0.9, 30), "disable_one": m(0.48, 10.5)},
        ],
        "offenders": [{"group": "g1", "score_db": 4.0}, {"group": "g2", "score_db": 1.0},
                      {"group": "g3", "score_db": 0.5}],
    }


def test_task_metric_per_candidate_ranks_the_promotions():
    s = sensitivity_from_dict(_analysis("top1_agreement"))
    assert s.metric == "top1_agreement" and s.base == 0.50 and s.reference == 0.99
    hi = Precision.A16_W16
    assert s.gain("g2", hi) > s.gain("g1", hi) > s.gain("g3", hi) == 0.0
    assert "2000 rows" in s.source


def test_fidelity_primaries_and_proxy_analyses_keep_the_sqnr_ranking():
    for a in (_analysis("cosine_mean"), _analysis("top1_agreement", with_task=False)):
        s = sensitivity_from_dict(a)
        assert s.metric == "output_sqnr_db"
        assert s.gain("g1", Precision.A16_W16) == 4.0


def test_the_worst_channel_sqnr_primary_keeps_the_sqnr_ranking():
    """Tensor data ranks by ``sqnr_db_channel_min`` (the fidelity scorer's primary). A
    proxy sweep measures it on a subset of the rows (a worst channel's SQNR does not add
    over rows), so its disable-one figures are not comparable with the all-row base:
    dinov2-s14's were all below it, every gain 0, and the planner promoted nothing. It
    is ranked by the SQNR each offender recovered, like the other fidelity metrics."""
    from quantscope.analyze.measure import FIDELITY_PRIMARIES
    from quantscope.serde import FIDELITY_METRICS

    assert set(FIDELITY_PRIMARIES) <= set(FIDELITY_METRICS)
    a = _analysis("sqnr_db_channel_min")
    for r in a["sensitivity"]:  # on the subset rows: every one below the all-row base
        r["disable_one"]["sqnr_db_channel_min"] = 5.0
    s = sensitivity_from_dict(a)
    assert s.metric == "output_sqnr_db"
    assert s.gain("g1", Precision.A16_W16) == 4.0 > s.gain("g2", Precision.A16_W16) > 0
