"""Audio embedders and audio models outside the zoo (h39): a speaker encoder (an LSTM over
a power mel spectrogram, a ReLU then an L2-normalised embedding), a posteriorgram model.

A ReLU embedding has units the data never activates: FP32 holds them at exactly 0, and a
quantized model whose upstream error lifts one above 0 on a sample made that channel's
SQNR -inf (no signal to measure noise against). ``sqnr_db_channel_min``, the plain-tensor
headline, was then -inf at every precision, 16 bit included, so the analysis found "no
gain" in any group and plans could not be told apart (Resemblyzer's encoder on espeak-ng
speakers: -inf at a8_w8 and at a16_w16 while the cosine went 0.72 -> 0.996).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.analyze.scoring import outputs_scorer
from quantscope.cli import main

N = 48


def relu_embedder() -> onnx.ModelProto:
    """``y = Relu(x W + b)``: unit 0 live (0.01 x0), unit 1 dead in FP32 (x1 - 0.75 < 0 on
    the data) but lifted above 0 once x1 (0.4 .. 0.7) sits on the coarse 8-bit grid that
    x0's -100 .. 100 sets (a step of 0.78)."""
    inits = [numpy_helper.from_array(np.array([[0.01, 0.0], [0.0, 1.0]], np.float32), "W"),
             numpy_helper.from_array(np.array([0.0, -0.75], np.float32), "b")]
    nodes = [helper.make_node("Gemm", ["x", "W", "b"], ["g"], name="gemm"),
             helper.make_node("Relu", ["g"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "relu_embedder",
                              [helper.make_tensor_value_info("x", 1, ["N", 2])],
                              [helper.make_tensor_value_info("y", 1, ["N", 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def data() -> np.ndarray:
    r = np.random.default_rng(3)
    return np.stack([r.uniform(-100, 100, N), r.uniform(0.4, 0.7, N)], 1).astype(np.float32)


def test_a_unit_fp32_never_activates_leaves_the_worst_channel_finite(tmp_path):
    onnx.save(relu_embedder(), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=data())
    m, d, st, ev = (str(tmp_path / f) for f in ("m.onnx", "d.npz", "s.npz", "ev.json"))
    assert main(["calibrate", m, "--data", d, "--out", st]) == 0
    assert main(["evaluate", m, "--data", d, "--stats", st, "--precision", "a8_w8",
                 "--json", ev]) == 0
    res = json.loads(Path(ev).read_text())
    out = res["outputs"]["y"]
    assert out["channel_worst"] == 0  # the live unit, not the one FP32 holds at 0
    assert np.isfinite(out["sqnr_db_channel_min"]) and out["sqnr_db_channel_min"] > 20.0
    assert out["cosine_channel_min"] > 0.99
    assert np.isfinite(res["metrics"]["sqnr_db_channel_min"])


def test_the_analysis_scores_the_live_units_too():
    x = data()
    ref = np.maximum(x @ np.array([[0.01, 0.0], [0.0, 1.0]], np.float32)
                     + np.array([0.0, -0.75], np.float32), 0)
    test = ref.copy()
    test[:, 0] += 0.001
    test[::7, 1] = 0.03  # the dead unit lifted on a few samples
    scorer = outputs_scorer()
    rows = scorer.reduce([ref], {"x": x})
    got = scorer.score(rows, scorer.reduce([test], {"x": x}))
    assert np.isfinite(got["sqnr_db_channel_min"]) and got["sqnr_db_channel_min"] > 30.0


def l2_embedder(*, declared_p: int = 2) -> onnx.ModelProto:
    """``e = g / ReduceL2(g)`` after a Gemm: a speaker encoder's head (torch.norm's export)."""
    r = np.random.default_rng(4)
    inits = [numpy_helper.from_array(r.normal(0, 1, (8, 16)).astype(np.float32), "W")]
    nodes = [helper.make_node("Gemm", ["x", "W"], ["g"], name="gemm"),
             helper.make_node("ReduceL2", ["g"], ["n"], keepdims=1, axes=[1], name="norm"),
             helper.make_node("Div", ["g", "n"], ["embedding"], name="div")]
    graph = helper.make_graph(nodes, "l2", [helper.make_tensor_value_info("x", 1, ["N", 8])],
                              [helper.make_tensor_value_info("embedding", 1, ["N", 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _a8_notes(tmp_path: Path) -> list[str]:
    """The notes of ``evaluate --precision a8_w8`` of ``m.onnx`` on ``d.npz`` in
    ``tmp_path`` (calibrated there first)."""
    m, d, st, ev = (str(tmp_path / f) for f in ("m.onnx", "d.npz", "s.npz", "ev.json"))
    assert main(["calibrate", m, "--data", d, "--out", st]) == 0
    assert main(["evaluate", m, "--data", d, "--stats", st, "--precision", "a8_w8",
                 "--json", ev]) == 0
    return json.loads(Path(ev).read_text())["notes"]


def test_an_l2_normalised_embedding_is_said_to_be_judged_by_fidelity_alone(tmp_path):
    """A speaker embedding given as tensors is scored by cosine and SQNR; the decision a
    deployment makes with it (same speaker at a threshold) is not, and nothing said so."""
    onnx.save(l2_embedder(), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(5).normal(0, 1, (16, 8)).astype(
        np.float32))
    notes = _a8_notes(tmp_path)
    said = [n for n in notes if "L2-normalised embedding" in n]
    assert len(said) == 1 and "'embedding'" in said[0] and "not scored" in said[0]


def test_run_repeats_it_as_a_warning_of_the_verdict(tmp_path, capsys):
    onnx.save(l2_embedder(), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(6).normal(0, 1, (16, 8)).astype(
        np.float32))
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "d.npz"),
                 "--target", "hailo8l", "--out", str(tmp_path / "W")]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines()
             if ln.strip().startswith("warning:") and "L2-normalised embedding" in ln]
    assert len(lines) == 1 and "not scored" in lines[0]
    verdict = json.loads((tmp_path / "W" / "verdict.json").read_text())
    assert len(verdict["embedding_fidelity_only"]) == 1


def speaker_data(n_per: int = 6, labels: int = 4, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Samples around one centre per label (a 'speaker'), shuffled; input spread wide
    enough that an 8-bit grid moves their embeddings."""
    r = np.random.default_rng(seed)
    centres = r.normal(0, 1, (labels, 8))
    lab = np.repeat(np.arange(labels), n_per)
    x = centres[lab] + r.normal(0, 0.6, (len(lab), 8))
    order = r.permutation(len(lab))
    return x[order].astype(np.float32), lab[order]


def test_verify_scores_every_pair_at_fp32s_equal_error_threshold():
    from quantscope.tasks.verify import VerifyTask
    from quantscope.types import Outputs

    x, lab = speaker_data()
    r = np.random.default_rng(1)
    emb = x @ r.normal(0, 1, (8, 16))
    noisy = emb + r.normal(0, 1.5, emb.shape)
    task = VerifyTask(name="verify:e", output="e", labels=lab, label_name="spk")
    m = task.metrics(Outputs(names=("e",), batches=((emb[:10],), (emb[10:],))),
                     Outputs(names=("e",), batches=((noisy[:10],), (noisy[10:],))))
    v = m.values

    def cos(e):
        u = e / np.linalg.norm(e, axis=1, keepdims=True)
        return (u @ u.T)[np.triu_indices(len(e), 1)]

    same = (lab[:, None] == lab[None, :])[np.triu_indices(len(lab), 1)]
    thr = v["verify_threshold"]
    dr, dt = cos(emb) >= thr, cos(noisy) >= thr
    assert v["decision_agreement"] == np.mean(dr == dt) < 1.0
    assert v["false_accept_rate"] == np.mean(dt[~same])
    assert v["true_accept_rate_fp32"] == np.mean(dr[same])
    # FP32's false accepts and false rejects are as near equal as its scores allow there
    assert abs(np.mean(dr[~same]) - np.mean(~dr[same])) < 0.1
    assert any("same-label" in n for n in m.notes)


def test_verify_from_the_cli_with_labels_in_the_data_file(tmp_path, capsys):
    """A speaker encoder's question (same speaker or not at the threshold) had no answer
    from tensors: only the embedding's cosine; now pairs are decided by both models."""
    onnx.save(l2_embedder(), tmp_path / "m.onnx")
    x, lab = speaker_data()
    np.savez(tmp_path / "d.npz", x=x, spk=lab)
    m, d, st, ev = (str(tmp_path / f) for f in ("m.onnx", "d.npz", "s.npz", "ev.json"))
    assert main(["calibrate", m, "--data", d, "--out", st]) == 0
    assert main(["evaluate", m, "--data", d, "--stats", st, "--precision", "a8_w8",
                 "--layout", "embedding=verify:labels=spk,threshold=0.5", "--json", ev]) == 0
    res = json.loads(Path(ev).read_text())
    assert res["metrics"]["verify_threshold"] == 0.5
    assert 0.0 < res["metrics"]["decision_agreement"] <= 1.0
    assert res["metrics"]["decision_agreement_items"] > 0
    assert any("judged by verification" in n for n in res["notes"])
    assert not any("L2-normalised embedding" in n for n in res["notes"])  # declared: scored


def test_verify_refusals_are_one_line(tmp_path, capsys):
    onnx.save(l2_embedder(), tmp_path / "m.onnx")
    x, lab = speaker_data()
    np.savez(tmp_path / "d.npz", x=x, spk=lab)
    np.savez(tmp_path / "short.npz", x=x, spk=lab[:-1])
    m, st = str(tmp_path / "m.onnx"), str(tmp_path / "s.npz")
    assert main(["calibrate", m, "--data", str(tmp_path / "d.npz"), "--out", st]) == 0
    capsys.readouterr()
    for layout, data, words in (
            ("embedding=verify", "d.npz", "needs labels=NAME"),
            ("embedding=verify:labels=speaker", "d.npz", "has no array 'speaker'"),
            ("embedding=verify:labels=spk,threshold=2", "d.npz", "is no cosine"),
            ("embedding=verify:labels=spk", "short.npz", "23 labels and the data 24")):
        rc = main(["evaluate", m, "--data", str(tmp_path / data), "--stats", st,
                   "--precision", "a8_w8", "--layout", layout])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and words in err[0], (layout, err)


def power_input_model() -> onnx.ModelProto:
    """``y = x W``: x a power spectrum fed as it is (no log), 16 bins."""
    w = np.random.default_rng(8).normal(0, 1, (16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="proj")], "power",
        [helper.make_tensor_value_info("x", 1, ["N", 16])],
        [helper.make_tensor_value_info("y", 1, ["N", 8])], [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _analyze(tmp_path, x: np.ndarray) -> tuple[list[dict], list[str]]:
    onnx.save(power_input_model(), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=x)
    m, d, st = (str(tmp_path / f) for f in ("m.onnx", "d.npz", "s.npz"))
    assert main(["calibrate", m, "--data", d, "--out", st]) == 0
    assert main(["analyze", m, "--data", d, "--stats", st, "--target", "hailo8l",
                 "--out", str(tmp_path / "an.json")]) == 0
    assert main(["evaluate", m, "--data", d, "--stats", st, "--precision", "a8_w8",
                 "--json", str(tmp_path / "ev.json")]) == 0
    found = [o for o in json.loads((tmp_path / "an.json").read_text())["outliers"]
             if o["kind"] == "input_floor"]
    notes = [n for n in json.loads((tmp_path / "ev.json").read_text())["notes"]
             if n.startswith("input 'x'")]
    return found, notes


def test_a_power_spectrum_fed_as_input_is_said_to_read_0_below_one_step(tmp_path):
    """Resemblyzer's power mel input: 85 % of its values read 0 at 8 bit, and analyze and
    evaluate named no cause for the embedding's cosine of 0.72 (the layers inside are not
    where the error is)."""
    x = 10.0 ** np.random.default_rng(9).uniform(-6, 1, (64, 16))
    found, notes = _analyze(tmp_path, x.astype(np.float32))
    assert len(found) == 1 and found[0]["group"] == "proj"
    assert "read 0 at 8 bit" in found[0]["reason"] and "log-compressed" in found[0]["remedies"][1]
    assert len(notes) == 1


def test_exact_zeros_and_ones_are_not_such_an_input(tmp_path):
    """A one-hot input is mostly exact zeros: on every grid, nothing lost."""
    x = np.eye(16, dtype=np.float32)[np.random.default_rng(10).integers(0, 16, 64)]
    found, notes = _analyze(tmp_path, x)
    assert found == [] and notes == []


def test_pitch_decodes_the_weighted_top_bins_and_voicing():
    """CREPE's host reads a frame's pitch from its top bin and the 4 bins each side,
    weighted by their activations, and its voicing from the top activation: a bin the data
    never raises moves neither (while its channel SQNR reads ~0 dB)."""
    from quantscope.tasks.pitch import PitchTask, decode
    from quantscope.types import Outputs

    bins = np.arange(40)
    ref = np.stack([np.exp(-0.5 * ((bins - c) / 1.5) ** 2) * a
                    for c, a in ((10.0, 0.9), (20.3, 0.8), (30.0, 0.1))])
    cents, top = decode(ref, 20.0)
    assert abs(cents[1] - 20.3 * 20) < 5.0 and abs(top[0] - 0.9) < 1e-9
    test = ref.copy()
    test[1] = np.exp(-0.5 * ((bins - 24.0) / 1.5) ** 2) * 0.8  # 74 cents up: moved
    test[2, 39] = 0.05  # a bin FP32 never raises: nothing the host reads
    task = PitchTask(name="pitch:p", output="p")
    m = task.metrics(Outputs(names=("p",), batches=((ref,),)),
                     Outputs(names=("p",), batches=((test,),)))
    v = m.values
    assert v["pitch_agreement"] == 0.5 and v["pitch_agreement_items"] == 2  # 2 voiced frames
    assert v["voicing_agreement"] == 1.0 and abs(v["voiced_share_fp32"] - 2 / 3) < 1e-9
    assert 60 < v["pitch_cents_error_max"] < 90
    assert any(n.startswith("NOT LIKE FP32: output 'p': 1 of 2 voiced") for n in m.notes)


def test_pitch_layout_from_the_cli(tmp_path):
    r = np.random.default_rng(11)
    inits = [numpy_helper.from_array(r.normal(0, 1, (8, 40)).astype(np.float32), "W")]
    nodes = [helper.make_node("Gemm", ["x", "W"], ["g"], name="gemm"),
             helper.make_node("Sigmoid", ["g"], ["probs"], name="sig")]
    graph = helper.make_graph(nodes, "pitch", [helper.make_tensor_value_info("x", 1, ["N", 8])],
                              [helper.make_tensor_value_info("probs", 1, ["N", 40])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 9
    onnx.save(proto, tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=r.normal(0, 1, (32, 8)).astype(np.float32))
    m, d, st, ev = (str(tmp_path / f) for f in ("m.onnx", "d.npz", "s.npz", "ev.json"))
    assert main(["calibrate", m, "--data", d, "--out", st]) == 0
    assert main(["evaluate", m, "--data", d, "--stats", st, "--precision", "a8_w8",
                 "--layout", "probs=pitch:threshold=0.5,tol=25", "--json", ev]) == 0
    res = json.loads(Path(ev).read_text())
    assert 0.0 <= res["metrics"]["pitch_agreement"] <= 1.0
    assert res["metrics"]["voicing_agreement"] > 0.5
    assert any("pitch within 25 cents" in n for n in res["notes"])
    assert main(["evaluate", m, "--data", d, "--stats", st, "--precision", "a8_w8",
                 "--layout", "probs=pitch:cents=0"]) == 2


def test_run_splits_labelled_samples_with_their_labels(tmp_path, capsys):
    """A verify task scores pairs across samples, so run had not split such data (NOT held
    out); the labels now go with the samples: the first half fits, the second half's pairs
    (with the second half's labels) are the held-out figure."""
    onnx.save(l2_embedder(), tmp_path / "m.onnx")
    x, lab = speaker_data()
    np.savez(tmp_path / "d.npz", x=x, spk=lab)
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "d.npz"),
                 "--layout", "embedding=verify:labels=spk", "--target", "qnn-htp-v73",
                 "--out", str(tmp_path / "W")]) == 0
    out = capsys.readouterr().out
    assert "n=12 held-out samples" in out and "NOT held out" not in out
    ev = json.loads((tmp_path / "W" / "evaluate.json").read_text())
    assert ev["data"]["is_held_out"]
    plan = ev["results"]["plan"]["metrics"]
    assert plan["decision_agreement_clusters"] == 11  # pairs of the 12 held-out samples
    assert "true_accept_rate_fp32" in plan


def test_an_undeclared_posteriorgram_is_named_as_judged_by_fidelity(tmp_path):
    """basic-pitch's three Sigmoid posteriorgrams ``[N, 172, 88]`` (a one-channel Conv
    reshaped) were scored by cosine and per time frame with nothing said; they are maps the
    host thresholds (frames at 0.3, onsets at 0.5)."""
    r = np.random.default_rng(12)
    inits = [numpy_helper.from_array(r.normal(0, 0.5, (1, 1, 3, 3)).astype(np.float32), "W"),
             numpy_helper.from_array(np.array([-1, 20, 24], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
             helper.make_node("Reshape", ["s", "shape"], ["note"], name="squeeze")]
    graph = helper.make_graph(nodes, "pg", [helper.make_tensor_value_info("x", 1, ["N", 1, 20, 24])],
                              [helper.make_tensor_value_info("note", 1, ["N", 20, 24])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 9
    onnx.save(proto, tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=r.normal(0, 1, (8, 1, 20, 24)).astype(np.float32))
    notes = _a8_notes(tmp_path)
    said = [n for n in notes if "shaped like a map" in n]
    assert len(said) == 1 and "'note' [?x20x24] (Sigmoid)" in said[0]
    assert "--layout note=map" in said[0]
