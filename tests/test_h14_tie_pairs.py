"""The tiebreak's jackknife (:mod:`quantscope.rewrites.tie`) leaves out one retrieval pair
(its query row and its document row together) at a time, not one row: a query and its
document come from one pair, so 2n rows are n independent samples."""

import numpy as np
import pytest

from quantscope import stages
from quantscope.model.load import load_proto
from quantscope.plan.race import t_quantile
from quantscope.rewrites.auto import Measured
from quantscope.rewrites.tie import (
    CONFIDENCE,
    decide_tie,
    gain_interval,
    pair_powers,
    pooled_db,
    row_powers,
)

PAIRS = 60


def _embeddings(seed: int = 0):
    """FP32 query and document rows and two quantized versions whose noise is shared by a
    pair's two rows (each pair's scale), as the rows of one text pair are."""
    rng = np.random.default_rng(seed)
    q, d = rng.normal(size=(PAIRS, 16)), rng.normal(size=(PAIRS, 16))
    pair_scale = rng.lognormal(0.0, 0.8, (PAIRS, 1))  # the same for a query and its document
    noisy = [(q + pair_scale * rng.normal(0, s, q.shape), d + pair_scale * rng.normal(0, s, d.shape))
             for s in (0.01, 0.0102)]
    return (q, d), noisy


def _jackknife_over_pairs(after, before):
    """The leave-one-pair-out interval, by hand."""
    s_a, n_a, s_b, n_b = (np.asarray(x, np.float64) for x in (*after[:2], *before[:2]))
    gain = 10 * np.log10(s_a.sum() * n_b.sum() / (n_a.sum() * s_b.sum()))
    loo = np.array([10 * np.log10((s_a.sum() - s_a[i]) * (n_b.sum() - n_b[i])
                                  / ((n_a.sum() - n_a[i]) * (s_b.sum() - s_b[i])))
                    for i in range(len(s_a))])
    n = len(s_a)
    se = np.sqrt((n - 1) / n * np.sum((loo - loo.mean()) ** 2))
    return gain, t_quantile(CONFIDENCE, n - 1) * se


def test_the_jackknife_leaves_out_a_pair_not_a_row():
    ref, (a, b) = _embeddings()
    after, before = pair_powers(ref, a), pair_powers(ref, b)
    assert after.unit == "pairs" and len(after.signal) == PAIRS
    rows_a = row_powers(np.concatenate(ref), np.concatenate(a))
    rows_b = row_powers(np.concatenate(ref), np.concatenate(b))
    # the same pooled figure as over every row (what embedding_sqnr_db is)
    assert pooled_db(after) == pytest.approx(pooled_db(rows_a), abs=1e-9)
    iv = gain_interval(after, before)
    gain, half = _jackknife_over_pairs(after, before)
    assert iv["n"] == PAIRS and iv["unit"] == "pairs"
    assert iv["difference"] == pytest.approx(gain, abs=1e-9)
    assert iv["upper"] - iv["difference"] == pytest.approx(half, rel=1e-9)
    by_rows = gain_interval(rows_a, rows_b)  # what the rows as samples gave: too narrow
    assert by_rows["n"] == 2 * PAIRS
    assert iv["upper"] - iv["lower"] > by_rows["upper"] - by_rows["lower"]


def test_the_tie_reason_counts_pairs():
    ref, (a, b) = _embeddings(1)
    after, before = pair_powers(ref, a), pair_powers(ref, b)
    got = decide_tie(Measured(1.0, pooled_db(after), None, after),
                     Measured(1.0, pooled_db(before), None, before), "embedding_sqnr_db")
    assert f"over {PAIRS} pairs" in got[1], got[1]
    assert "rows" not in got[1]


def test_the_run_measure_gives_one_part_per_pair():
    """``run``'s measure on text pairs gives the tiebreak one unit per pair (20 pairs: 20
    units, not 40 rows), pooling to the embedding SQNR it reports."""
    from test_tasks_text import tiny_encoder

    from quantscope.pipeline.auto import max_legal_measure
    from quantscope.pipeline.data import open_fit_data
    from quantscope.targets import load_target

    model = load_proto(tiny_encoder(), "tiny")
    fit = open_fit_data(model, "stdlib-docs", eval_data=None, pairs=20, tokenizer=None)
    stats = stages.calibrate_model(model, fit, progress=False)
    got = max_legal_measure(fit, load_target("ort-cpu"), "top1_agreement", seq_len=None,
                            tiebreak="embedding_sqnr_db")(model, stats)
    parts = got.tiebreak_parts
    assert parts is not None and len(parts.signal) == 20 and parts.unit == "pairs"
    assert pooled_db(parts) == pytest.approx(got.tiebreak, abs=1e-6)
