"""Per-layer diagnosis: noise, task-level sensitivity, outliers, degenerate weights, collapse.

``analyze(model, groups, stats, batches, scorer=...) -> Analysis`` (:mod:`.diagnose`) is
the one entry; the CLI writes :func:`analysis_to_dict` as JSON and prints
:func:`summary_text`.

Modules: ``diagnose`` (the analysis itself), ``candidates`` (the plans a sweep evaluates
and their encodings), ``segments`` (graph cuts and the segment engine), ``rows``
(full-model rows, row subsets), ``sweeps`` (segment, naive and fast sweeps), ``scoring``,
``noise``, ``outliers``, ``mixed``, ``weights``, ``report`` (the analysis value and its
JSON), ``measure`` and ``whatif`` (a plan's measurement, the per-family what-if).

This face imports nothing itself: each name below is imported on first use (PEP 562), so
importing one module of the package (``quantscope.analyze.measure``, as ``stages`` does)
does not load every other.
"""

from __future__ import annotations

from quantscope.lazy import lazy_face

_LAZY = {
    **dict.fromkeys(("CHANNEL_KEY", "RECOVER_TOP", "analyze", "rank_key"),
                    "quantscope.analyze.diagnose"),
    "find_mixed_scales": "quantscope.analyze.mixed",
    **dict.fromkeys(("TensorNoise", "tensor_noise"), "quantscope.analyze.noise"),
    **dict.fromkeys(("Outlier", "find_outliers"), "quantscope.analyze.outliers"),
    **dict.fromkeys(("Analysis", "GroupSensitivity", "Offender", "Recovery", "Skipped",
                     "analysis_from_dict", "analysis_to_dict", "mixed_scale_lines",
                     "summary_text"), "quantscope.analyze.report"),
    **dict.fromkeys(("proxy_batches", "run_plan_rows", "squared_error_rows"),
                    "quantscope.analyze.rows"),
    **dict.fromkeys(("Scorer", "fidelity", "text_retrieval_scorer"),
                    "quantscope.analyze.scoring"),
    "sweep_naive": "quantscope.analyze.naive",
    **dict.fromkeys(("SweepResult", "sweep_fast", "sweep_segments"),
                    "quantscope.analyze.sweeps"),
    **dict.fromkeys(("WeightIssue", "find_weight_issues"), "quantscope.analyze.weights"),
}

__all__ = [
    "Analysis",
    "GroupSensitivity",
    "Offender",
    "Outlier",
    "Recovery",
    "Scorer",
    "Skipped",
    "TensorNoise",
    "WeightIssue",
    "analysis_from_dict",
    "analysis_to_dict",
    "analyze",
    "find_mixed_scales",
    "find_outliers",
    "find_weight_issues",
    "mixed_scale_lines",
    "proxy_batches",
    "rank_key",
    "summary_text",
    "sweep_fast",
    "sweep_naive",
    "sweep_segments",
    "text_retrieval_scorer",
]


__getattr__, __dir__ = lazy_face(__name__, _LAZY)
