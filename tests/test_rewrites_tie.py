"""``run --rewrites auto``'s tie rule (:mod:`quantscope.rewrites.tie`): a tie of the
headline is decided by the tiebreak SQNR gaining more than the margin beyond its own noise
(jackknife over the units), so two functionally identical models whose gains sit either
side of the margin take the same decision, said to be a tie on both figures."""

import json
from pathlib import Path

import numpy as np
import pytest
from test_repair_tokens import SEQ, SMALL
from test_repair_tokens import _encoder as token_encoder

from quantscope import stages
from quantscope.model.load import load_proto
from quantscope.numerics import sqnr_db
from quantscope.rewrites.auto import TIE_MARGIN, AutoChoice, Measured, choose_rewrites
from quantscope.rewrites.tie import gain_interval, pooled_db, row_powers

ROWS = 120  # embedding rows: 60 pairs' queries and documents


def _fit(tmp_path: Path, model):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", input_ids=rng.integers(100, 1000, (16, SEQ)).astype(np.int64),
             attention_mask=np.ones((16, SEQ), np.int64))
    return stages.at_length(stages.open_data(tmp_path / "x.npz", model, show=False), SEQ)


def _parts(gain_db: float, jitter: float, seed: int = 0):
    """Per-row (signal, noise) powers of a model without the rewrite and of the rewritten
    one, whose pooled SQNR gains exactly ``gain_db``; each row's noise changes by a factor
    spread by ``jitter`` (log-normal), as rows of real embeddings do."""
    rng = np.random.default_rng(seed)
    signal = rng.uniform(50.0, 150.0, ROWS)
    before = signal * 10 ** (-36.0 / 10) * rng.lognormal(0.0, 0.5, ROWS)
    after = before * rng.lognormal(0.0, jitter, ROWS)
    after *= before.sum() / after.sum() * 10 ** (-gain_db / 10)
    return (signal, before), (signal, after)


def _measure(gain_db: float, jitter: float, seed: int = 0):
    """A tie of the headline (every query agrees with and without the rewrite), the
    tiebreak from :func:`_parts`."""
    before, after = _parts(gain_db, jitter, seed)
    agree = np.ones(ROWS // 2)

    def measure(m, s):
        parts = after if any(n.name.endswith("/tok1") for n in m.graph.node) else before
        return Measured(1.0, pooled_db(parts), agree, parts)

    return measure


def _split_trial(model, fit, measure):
    choice, proto = choose_rewrites(model, SMALL, SEQ,
                                    calibrate=lambda m: stages.calibrate_model(m, fit),
                                    measure=measure, reload=lambda p: load_proto(p, "enc"),
                                    metric="top1_agreement", tiebreak="embedding_sqnr_db")
    return choice, proto, next(t for t in choice.trials if t.name == "tokensplit")


def test_two_identical_models_either_side_of_the_margin_take_the_same_decision(tmp_path):
    """The given encoder and a copy with every node renamed, measured a headline tie with
    SQNR gains 0.0002 dB either side of the margin (as reported on two real encoders:
    35.84 -> 35.94 dropped on one, kept on the other): both drop the rewrite, say it is a
    tie on both figures and what the rewrite measured (the verdict's short form too), and
    record the interval."""
    from quantscope.report.summary import auto_rewrites

    proto = token_encoder()
    renamed = token_encoder()
    for i, node in enumerate(renamed.graph.node):
        node.name = f"n{i}_{node.name}"
    decided = []
    for model, gain in ((load_proto(proto, "enc"), TIE_MARGIN + 2e-4),
                        (load_proto(renamed, "enc"), TIE_MARGIN - 2e-4)):
        fit = _fit(tmp_path, model)
        choice, kept_proto, t = _split_trial(model, fit, _measure(gain, 0.3))
        assert t.tried and t.tiebreak_after - t.tiebreak_before == pytest.approx(gain)
        decided.append((choice.kept, kept_proto is None, t.kept))
        assert t.tiebreak_interval["outcome"] == "tie", t.tiebreak_interval
        assert t.tiebreak_interval["lower"] < TIE_MARGIN < t.tiebreak_interval["upper"]
        assert "a tie on both figures: embedding_sqnr_db" in t.reason
        assert "the model without it kept (fewer layers), with it embedding_sqnr_db " \
               "measured" in t.reason
        record = choice.to_dict()
        assert AutoChoice.from_dict(json.loads(json.dumps(record))) == choice
        said = auto_rewrites(record)  # the verdict's and the report's
        assert "a tie on both figures, left out: tokensplit" in said["short"]
        lines = "\n".join(said["lines"])
        assert "tokensplit: dropped" in lines and "a tie on both figures" in lines
    assert decided == [((), True, False)] * 2


def test_a_tiebreak_gain_beyond_noise_and_the_margin_is_kept(tmp_path):
    """0.5 dB on every row alike: kept, said to be beyond noise; 0.02 dB on every row
    alike (consistent, but under the margin): dropped as not better."""
    model = load_proto(token_encoder(), "enc")
    fit = _fit(tmp_path, model)
    choice, proto, t = _split_trial(model, fit, _measure(0.5, 0.02))
    assert t.kept and choice.kept == ("tokensplit",) and proto is not None
    assert t.tiebreak_interval["outcome"] == "better"
    assert t.tiebreak_interval["lower"] > TIE_MARGIN
    assert "decided by better embedding_sqnr_db" in t.reason and "beyond noise" in t.reason
    _, proto, t = _split_trial(model, fit, _measure(0.02, 0.02))
    assert not t.kept and proto is None and t.tiebreak_interval["outcome"] == "not better"
    assert "not better on embedding_sqnr_db" in t.reason


def test_the_gain_interval_pools_the_rows_as_the_sqnr_does():
    """The interval's gain is the pooled SQNR's (the figure recorded), its bounds widen
    with the spread of the rows' changes and vanish when every row changes alike."""
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(ROWS, 16))
    a, b = ref + rng.normal(0, 0.01, ref.shape), ref + rng.normal(0, 0.02, ref.shape)
    after, before = row_powers(ref, a), row_powers(ref, b)
    assert pooled_db(after) == pytest.approx(sqnr_db(ref, a), abs=1e-9)
    iv = gain_interval(after, before)
    assert iv["difference"] == pytest.approx(sqnr_db(ref, a) - sqnr_db(ref, b), abs=1e-9)
    assert iv["lower"] < iv["difference"] < iv["upper"] and iv["outcome"] == "better"
    alike = (before[0], before[1] / 2)
    same = gain_interval(alike, before)
    assert same["upper"] - same["lower"] == pytest.approx(0.0, abs=1e-9)
    assert gain_interval((before[0][:2], before[1][:2]), (before[0][:2], before[1][:2])) is None


def test_the_run_measure_gives_the_pairs_the_embedding_sqnr_pools():
    from test_tasks_text import tiny_encoder

    from quantscope.pipeline.auto import max_legal_measure
    from quantscope.pipeline.data import open_fit_data
    from quantscope.targets import load_target

    model = load_proto(tiny_encoder(), "tiny")
    fit = open_fit_data(model, "stdlib-docs", eval_data=None, pairs=20, tokenizer=None)
    stats = stages.calibrate_model(model, fit, progress=False)
    got = max_legal_measure(fit, load_target("ort-cpu"), "top1_agreement", seq_len=None,
                            tiebreak="embedding_sqnr_db")(model, stats)
    assert got.tiebreak_parts is not None and len(got.tiebreak_parts[0]) == 20  # pairs
    assert pooled_db(got.tiebreak_parts) == pytest.approx(got.tiebreak, abs=1e-6)


@pytest.mark.parametrize(("gain", "tiebreak_gain", "kept", "words"), [
    (1e-6, 0.0, False, "a tie within the 0.1 margin (gain +0.000001 dB"),
    (-1e-6, 0.0, False, "a tie within the 0.1 margin (gain -0.000001 dB"),
    (0.05, 0.5, True, "a tie within the 0.1 margin (gain +0.050 dB; no per-sample scores: no "
                      "noise estimate), decided by better sqnr_db"),
    (0.5, 0.0, True, "measured better by more than the 0.1 margin (no per-sample scores"),
])
def test_tensor_data_without_per_sample_scores_needs_the_margin(tmp_path, gain,
                                                                tiebreak_gain, kept, words):
    """Tensor data gives no per-sample scores: the headline (the worst channel's SQNR, dB)
    kept a rewrite better by any amount, so two functionally identical models measuring
    +1e-6 and -1e-6 dB took opposite decisions. ``run`` now passes the headline's margin
    (0.1 dB for a figure in dB): within it the tiebreak decides, with the same margin."""
    from quantscope.pipeline.auto import TIEBREAK, headline_margin

    model = load_proto(token_encoder(), "enc")
    fit = _fit(tmp_path, model)
    head = stages.headline(fit, None)
    assert head.unit == "dB" and headline_margin(head.unit) == TIE_MARGIN

    def measure(m, s):
        split = any(n.name.endswith("/tok1") for n in m.graph.node)
        return Measured(20.0 + gain * split, 30.0 + tiebreak_gain * split)

    choice, proto = choose_rewrites(model, SMALL, SEQ,
                                    calibrate=lambda m: stages.calibrate_model(m, fit),
                                    measure=measure, reload=lambda p: load_proto(p, "enc"),
                                    metric=head.metric, tiebreak=TIEBREAK["fit samples"],
                                    margin=headline_margin(head.unit))
    split = next(t for t in choice.trials if t.name == "tokensplit")
    assert split.tried and split.kept is kept and (proto is not None) is kept
    assert words in split.reason, split.reason
