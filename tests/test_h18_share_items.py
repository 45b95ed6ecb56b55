"""``run --rewrites auto`` on a share headline whose count of items differs between the
two figures (detection F1 over the detections of either model): each figure's binomial
error over its own count."""

from __future__ import annotations

from quantscope import stages


def test_a_share_whose_count_differs_between_plans_uses_each_figures_own(tmp_path):
    """Detection F1's items are both models' detections: the model with the rewrite
    counts other ones. Before, unequal counts meant no noise estimate (and one item kept
    the rewrite); now each figure's binomial error is over its own count."""
    from test_h14_share_noise import SEQ, SMALL, _fit, token_encoder

    from quantscope.model.load import load_proto
    from quantscope.rewrites.auto import Measured, choose_rewrites

    what = "detections of either model (a matched pair once)"
    model = load_proto(token_encoder(), "enc")
    fit = _fit(tmp_path, model)

    def measure(m, s):
        split = any(n.name.endswith("/tok1") for n in m.graph.node)
        n = 165 if split else 163
        return Measured((150 + 2 * split) / n, 30.0, share_of=(n, what))  # +0.1 pt

    choice, proto = choose_rewrites(model, SMALL, SEQ,
                                    calibrate=lambda m: stages.calibrate_model(m, fit),
                                    measure=measure, reload=lambda p: load_proto(p, "enc"),
                                    metric="detection_f1", tiebreak="sqnr_db")
    t = next(t for t in choice.trials if t.name == "tokensplit")
    assert t.tried and not t.kept and proto is None, t.reason
    assert f"n 163, n' 165 {what}" in t.reason and "q(1-q)/n')" in t.reason, t.reason
