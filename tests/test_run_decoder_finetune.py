"""``run DECODER --finetune on`` (pipeline/decoder_finetune.py), on the tiny decoder: the
stage trains, measures and decides; kept, every later stage ships the tuned graphs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from decoder_tiny import AMOUNTS, SEQ, byte_decoder
from decoder_tiny import run_cli as _run
from onnx import numpy_helper

from quantscope.analyze.prefix import compute_prefix
from quantscope.cli import main
from quantscope.pipeline import decoder_finetune
from quantscope.pipeline.decoder_finetune import _decision
from quantscope.pipeline.manifest import file_digest
from quantscope.stages_llm import open_phase
from quantscope.zoo.prefix import read_prefix


def _weights(path) -> dict[str, np.ndarray]:
    proto = onnx.load(str(path))
    return {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer
            if "_proj.weight" in t.name}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A run whose fine-tune is kept: the keep rule forced (the flow under test is what a
    kept fine-tune changes; the rule itself is tested on figures below), two steps at a
    rate that moves the weights visibly (the budget then never ends it: the same steps
    on any machine), the grids calibrated again between them."""
    folder = tmp_path_factory.mktemp("decft")
    model = byte_decoder(folder)
    before = {p.name: file_digest(p) for p in folder.iterdir()}
    out = folder / "run"
    args = ["run", str(model), "--data", "stdlib-docs", "--target", "hailo10h", "--goal",
            "1.5", "--seq-len", str(SEQ), *AMOUNTS, "--w4", "off", "--finetune", "on",
            "--budget", "10m", "--out", str(out)]
    mp = pytest.MonkeyPatch()
    mp.setattr(decoder_finetune, "_decision", lambda *a: (True, "kept by the test"))
    mp.setattr(decoder_finetune, "MAX_STEPS", 2)
    mp.setattr(decoder_finetune, "LR", 1e-3)
    mp.setattr(decoder_finetune, "REGRID_EVERY", 1)  # the grids calibrated again after step 1
    try:
        code, printed = _run(args)
    finally:
        mp.undo()
    assert code == 0, printed
    return folder, out, printed, args, before


def test_a_kept_finetune_is_what_every_later_stage_ships(tuned) -> None:
    folder, out, printed, _, before = tuned
    doc = json.loads((out / "finetune.json").read_text())
    assert doc["asked"] and doc["kept"] and doc["training"]["steps"] == 2
    assert [r["step"] for r in doc["training"]["regrids"]] == [1]
    assert doc["training"]["regrids"][0]["grids_changed"] > 0
    assert doc["trained_by"] == "torch (cpu)" and doc["measured_by"] == "onnxruntime"
    # the tuned graphs differ from the rewritten ones; the exported float graphs are them
    ref = _weights(out / "model" / "model.decode.onnx")
    new = _weights(out / "model.tuned" / "model.decode.onnx")
    assert ref and ref.keys() == new.keys()
    assert max(np.abs(ref[n] - new[n]).max() for n in ref) > 1e-4
    shipped = _weights(out / "decode" / "model.onnx")
    assert all(np.array_equal(shipped[n], new[n]) for n in new)
    # the host loads the prefix of the tuned weights, not the plan stage's
    host = json.loads((out / "host.json").read_text())
    assert "finetune.prefix.npz" in json.dumps(host) and "plan.prefix.npz" not in json.dumps(host)
    kv = read_prefix(out / "finetune.prefix.npz")
    fresh = compute_prefix(open_phase(out / "model.tuned" / "model.prefill.onnx", "prefill"),
                           kv.tokens)
    assert all(np.array_equal(a, b) for a, b in zip(kv.keys, fresh.keys, strict=True))
    old = read_prefix(out / "plan.prefix.npz")
    assert max(np.abs(a - b).max() for a, b in zip(kv.keys, old.keys, strict=True)) > 1e-5
    # the verdict judges the tuned figures and says so
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["finetune"]["kept"] is True
    ppl = doc["figures"]["prefill"]["ppl_ratio"]
    assert verdict["figures"]["ppl_ratio"]["value"] == ppl
    assert "fine-tune: " in printed and "kept: the figures above are the fine-tuned" in printed
    assert "fine-tuned graphs against the original FP32" in verdict["measured_by"]
    assert {p.name: file_digest(p) for p in folder.iterdir() if p.name != "run"} == before


def test_a_finetuned_run_resumes_and_drops_the_tuned_files_when_not_asked(tuned) -> None:
    _, out, _, args, _ = tuned
    code, printed = _run(args)
    assert code == 0 and "stages run: none" in printed
    plain = [a for a in args if a not in ("--finetune", "on", "--budget", "10m")]
    code, printed = _run(plain)
    assert code == 0 and "stages run: finetune, w4, whatif, export, host, report" in printed
    assert json.loads((out / "finetune.json").read_text()) == {"asked": False}
    assert not (out / "model.tuned").exists() and not (out / "finetune.prefix.npz").exists()
    assert "plan.prefix.npz" in (out / "host.json").read_text()


@pytest.mark.parametrize(("metric", "before", "after", "keep"), [
    ("ppl_ratio", (1.10, 0.01), (1.05, 0.01), True),  # 0.05 lower, SE of the diff 0.014
    ("ppl_ratio", (1.10, 0.03), (1.07, 0.03), False),  # within the noise
    ("ppl_ratio", (1.05, 0.01), (1.10, 0.01), False),  # worse
    ("top1_agreement", (0.80, 0.01), (0.85, 0.01), True),
    ("decode_top1", (0.90, 0.02), (0.91, 0.02), False),
])
def test_the_keep_rule_wants_a_gain_beyond_the_noise(metric, before, after, keep) -> None:
    from quantscope.pipeline.decoder_report import METRICS

    m = METRICS[metric]

    def fig(value, se):
        return {m.phase: {m.key: value, f"{m.key}_se": se}}

    kept, why = _decision(metric, fig(*before), fig(*after))
    assert kept is keep
    assert ("kept" if keep else "untuned model ships") in why
    assert ("worse" in why) is (after[0] < before[0] if m.higher else after[0] > before[0])


@pytest.mark.parametrize(("decode", "keep"), [
    ((0.88, 0.02), True),  # 1 point worse, 0.35 SE of the difference: within the noise
    ((0.78, 0.02), False),  # 11 points worse, 3.9 SE: the better perplexity is not kept
])
def test_another_figure_worse_beyond_the_noise_vetoes_a_keep(decode, keep) -> None:
    before = {"prefill": {"ppl_ratio": 1.10, "ppl_ratio_se": 0.01},
              "decode_emu_kv": {"top1_agreement": 0.89, "top1_agreement_se": 0.02}}
    after = {"prefill": {"ppl_ratio": 1.05, "ppl_ratio_se": 0.01},
             "decode_emu_kv": {"top1_agreement": decode[0], "top1_agreement_se": decode[1]}}
    kept, why = _decision("ppl_ratio", before, after)
    assert kept is keep
    assert ("decode_top1 0.8900 -> 0.7800" in why) is (not keep)
    assert why.endswith("kept" if keep else "the untuned model ships")


def test_a_metric_not_measured_keeps_nothing_and_says_so() -> None:
    kept, why = _decision("greedy_agreement", {"prefill": {}}, {"prefill": {}})
    assert not kept and why == ("greedy_agreement was not measured on both models: the "
                                "untuned model ships")


@pytest.mark.parametrize(("extra", "words"), [
    (["--budget", "5m"], "spends it on the fine-tune only"),
    (["--finetune", "on", "--budget", "none"], "needs a time budget"),
])
def test_a_decoder_finetune_refuses_a_budget_it_cannot_use(tmp_path, capsys, extra,
                                                           words) -> None:
    model = byte_decoder(tmp_path)
    args = ["run", str(model), "--data", "stdlib-docs", "--target", "hailo10h", "--out",
            str(tmp_path / "run"), *extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_with_initializers_replaces_by_name_in_place_and_names_a_stranger(tmp_path) -> None:
    from quantscope.model.load import with_initializers
    from quantscope.types import QuantscopeError

    model = open_phase(byte_decoder(tmp_path), "decode")
    name = "layers.0.q_proj.weight.T"
    new = np.full_like(_weights(tmp_path / "byte.decode.onnx")[name], 0.5)
    out = with_initializers(model, {name: new}, "test")
    assert out.proto is model.proto and out.source.endswith("+ test")
    got = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    assert np.array_equal(got[name], new)
    with pytest.raises(QuantscopeError, match="no initializer 'nowhere'"):
        with_initializers(model, {"nowhere": new}, "test")
