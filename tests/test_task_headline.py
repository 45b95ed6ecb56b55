"""The task decides the headline metric: `plan`, `run`, the analysis and the fine-tune all
ask it, so they optimise the same number (issue 32: on STS data `run` judged by sqnr_db
while `plan` judged by score_agreement)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from test_tasks_text import tiny_encoder

from quantscope import stages
from quantscope.cli import main
from quantscope.model.load import load_proto
from quantscope.pipeline.context import Context, RunOptions
from quantscope.serde import read_json
from quantscope.tasks.images import ViewRetrievalTask
from quantscope.types import Dataset

PAIRS = [("a cat sits on the mat", "a cat is on a mat", 4.8),
         ("a man plays the guitar", "someone plays an instrument", 3.6),
         ("the stock market fell", "a cat is on a mat", 0.2),
         ("it is raining today", "the weather is wet", 3.9),
         ("python lists are mutable and can be changed in place", "tuples cannot change", 2.1),
         ("open the file for reading", "read the file contents", 4.0)]


def sts_inputs(tmp_path):
    """A tiny sentence encoder and a six-pair STS file (tab-separated, human scores)."""
    m, tsv = tmp_path / "enc.onnx", tmp_path / "p.tsv"
    onnx.save(tiny_encoder(), m)
    tsv.write_text("sentence1\tsentence2\tscore\n"
                   + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in PAIRS))
    return m, tsv


def test_sts_run_judges_by_the_tasks_headline_like_plan(tmp_path, capsys):
    m, tsv = sts_inputs(tmp_path)
    model = load_proto(tiny_encoder(), "enc")
    data = stages.open_data(str(tsv), model)
    assert stages.default_metric(data) == "score_agreement"
    # the run's metric is the same one (it used a class-name table: sqnr_db for STS)
    ctx = Context(RunOptions(model=str(m), data=str(tsv), target="hailo8",
                             out=str(tmp_path / "W")), tmp_path)
    assert ctx.metric() == "score_agreement"
    # the analysis ranks by it too, and the fine-tune distils the pooled embedding
    assert stages.scorer_for(data).primary == "score_agreement"
    assert main(["run", str(m), "--data", str(tsv), "--target", "hailo8", "--out",
                 str(tmp_path / "W")]) == 0
    v = read_json(tmp_path / "W" / "verdict.json", "verdict")
    assert v["metric"] == "score_agreement"
    assert "verdict: no --goal given; score_agreement" in capsys.readouterr().out
    assert read_json(tmp_path / "W" / "evaluate.json", "evaluate")["metric"] == "score_agreement"


def test_the_fine_tune_objective_comes_from_the_task(tmp_path):
    pytest.importorskip("torch")
    from quantscope.finetune.objectives import EmbeddingLoss, OutputsLoss, objective_for

    _, tsv = sts_inputs(tmp_path)
    model = load_proto(tiny_encoder(), "enc")
    sts = stages.open_data(str(tsv), model)
    obj, mask = objective_for(model, sts.task)  # STS reads pooled embeddings, as retrieval
    assert isinstance(obj, EmbeddingLoss) and mask == "attention_mask"
    obj, mask = objective_for(model, None)
    assert isinstance(obj, OutputsLoss) and mask is None


def test_every_task_declares_its_headline():
    from quantscope.tasks.headline import TENSOR_HEADLINE, headline_of

    views = ViewRetrievalTask(name="view-retrieval:test", photo=np.zeros(4, np.int32))
    data = Dataset(name="views", calibration=(), evaluation=(), task=views)
    assert stages.default_metric(data) == "top1_agreement"  # was sqnr_db: no isinstance
    h = headline_of(views)
    assert (h.metric, h.higher_is_better, h.goal_range, h.unit) == (
        "top1_agreement", True, (0.0, 1.0), "")
    tensors = headline_of(None)
    assert tensors.metric == TENSOR_HEADLINE and tensors.unit == "dB"
    assert stages.default_metric(None) == TENSOR_HEADLINE
    named = headline_of(views, "sqnr_db")  # --metric wins over the task
    assert named.metric == "sqnr_db" and named.unit == "dB"


def test_a_row_local_task_is_scored_by_its_own_metrics_in_the_analysis():
    """A task that reads each sample alone (the tensor-output tasks of --layout) needs no
    scorer of its own: the analysis ranks by its headline, computed by its metrics."""
    from dataclasses import dataclass

    from outside_models import feeds, scalar_probability

    from quantscope.types import Metrics, Outputs

    @dataclass(frozen=True)
    class SpeechDecisions:  # the same speech/silence decision as FP32 at 0.5
        name: str = "speech"
        headline: str = "decision_agreement"
        higher_is_better: bool = True
        row_local: bool = True

        def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
            r = np.concatenate([b[0] for b in ref.batches]) > 0.5
            t = np.concatenate([b[0] for b in test.batches]) > 0.5
            return Metrics(values={"decision_agreement": float(np.mean(r == t))})

    model = load_proto(scalar_probability(), "vad")
    data = Dataset(name="vad", calibration=(), evaluation=(), task=SpeechDecisions())
    assert stages.default_metric(data) == "decision_agreement"
    assert stages.headline(data).goal_range == (0.0, 1.0)
    scorer = stages.scorer_for(data, model)
    assert scorer.primary == "decision_agreement" and scorer.row_local
    x = feeds("scalar_probability", 16)
    ref = np.asarray([0.2, 0.7, 0.9, 0.4], np.float32)
    rows = scorer.reduce([ref], x)
    flipped = scorer.reduce([np.asarray([0.6, 0.7, 0.9, 0.4], np.float32)], x)
    assert scorer(rows, rows)["decision_agreement"] == 1.0
    assert scorer(rows, flipped)["decision_agreement"] == 0.75  # one decision of 4 flips
