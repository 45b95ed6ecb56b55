"""A plan for sequence length N is measured on what a deployment at N runs: texts
truncated at N tokens exactly as the tokenizer truncates them."""

from __future__ import annotations

import numpy as np
from test_tasks_text import tiny_encoder

from quantscope import stages
from quantscope.model.load import load_proto
from quantscope.tasks import text
from quantscope.tasks.registry import RetrievalTask, at_length

N = 24


def _texts() -> list[str]:
    pairs = text.load_pairs("stdlib-docs")
    return list(pairs.queries[:20]) + list(pairs.documents[:20])


def test_truncated_batches_equal_the_tokenizers_own_truncation():
    enc = text.detect_encoder(tiny_encoder(inputs=("input_ids", "attention_mask",
                                                   "token_type_ids")))
    full = text.make_batches(_texts(), text.load_tokenizer(), enc, batch_size=8)
    cut = text.make_batches(_texts(), text.load_tokenizer(max_length=N), enc, batch_size=8)
    assert max(b["input_ids"].shape[1] for b in full) > N  # some texts are longer
    ours = text.truncate_batches(full, N, enc)
    np.testing.assert_array_equal(ours.order, full.order)

    def rows(tb):  # per text: the tokenizer's own truncation may re-sort equal lengths
        out = {}
        for k, b in enumerate(tb.batches):
            for r in range(len(b["input_ids"])):
                n = int(b["attention_mask"][r].sum())
                out[int(tb.order[k * 8 + r])] = {name: tuple(v[r, :n]) for name, v in b.items()}
        return out

    assert rows(ours) == rows(cut)


def test_at_length_truncates_retrieval_data_and_says_so():
    model = load_proto(tiny_encoder(), "tiny-encoder")
    data = stages.open_data("stdlib-docs", model, max_pairs=20)
    short = at_length(data, N)
    assert isinstance(short.task, RetrievalTask)
    assert max(b["input_ids"].shape[1] for b in short.evaluation) == N
    assert max(b["input_ids"].shape[1] for b in short.calibration) <= N
    assert short.task.batches.batches == short.evaluation
    assert any(f"texts truncated at {N} tokens" in n for n in short.notes)
    assert at_length(data, 100_000) is data  # nothing longer: unchanged
    assert at_length(short, N) is short
    # the truncated set is scored like any other (FP32 against FP32 at the same length)
    res = stages.evaluate_plans(model, short, stages.calibrate_model(model, short),
                                {"float": stages.Plan.uniform(stages.Precision.FLOAT)})
    assert res["float"]["metrics"]["top1_agreement"] == 1.0


def test_plan_for_a_length_says_it_measured_truncated_texts():
    from quantscope.model.groups import find_groups
    from quantscope.targets import load_target
    from quantscope.types import Precision, Sensitivity

    model = load_proto(tiny_encoder(), "tiny-encoder")
    data = stages.open_data("stdlib-docs", model, max_pairs=20)
    stats = stages.calibrate_model(model, data)
    sens = Sensitivity(metric="sqnr_db", base=10.0, gains=tuple(
        (g.name, ((Precision.A16_W16, 1.0),)) for g in find_groups(model).groups))
    out = stages.plan_model(model, sens, load_target("ort-cpu"),
                            stages.PlanOptions(max_cost=1.0, seq_len=N), data=data,
                            stats=stats)
    assert f"texts truncated at {N} tokens" in out.pareto["measured_on"]
    assert "measured on: texts truncated" in stages.format_search(out.pareto)
    full = stages.plan_model(model, sens, load_target("ort-cpu"),
                             stages.PlanOptions(max_cost=1.0), data=data, stats=stats)
    assert "measured_on" not in full.pareto


def test_evaluate_seq_len_measures_truncated_texts(tmp_path, capsys):
    import json

    import onnx

    from quantscope.cli import main

    m, st = tmp_path / "enc.onnx", tmp_path / "s.npz"
    onnx.save(tiny_encoder(), m)
    assert main(["calibrate", str(m), "--data", "stdlib-docs", "--out", str(st)]) == 0
    base = ["evaluate", str(m), "--data", "stdlib-docs", "--stats", str(st), "--precision",
            "a8_w8", "--pairs", "20"]
    assert main([*base, "--json", str(tmp_path / "full.json")]) == 0
    assert "truncated" not in capsys.readouterr().out
    assert main([*base, "--seq-len", str(N), "--json", str(tmp_path / "cut.json")]) == 0
    assert f"texts truncated at {N} tokens" in capsys.readouterr().out
    full = json.loads((tmp_path / "full.json").read_text())["metrics"]
    cut = json.loads((tmp_path / "cut.json").read_text())["metrics"]
    assert full["embedding_cosine_mean"] != cut["embedding_cosine_mean"]
