"""A corpus of bad inputs across every subcommand (issue 12).

Each case asserts: exit code 2, exactly one stderr line naming the problem (and the fix),
no traceback and no "internal error", no file created or left behind in the output
folder, and every input file unchanged (sha256 before and after, the input folder's
listing too). The inputs are tiny models and files made once per module.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import tiny_models as tm
from onnx import helper, numpy_helper

from quantscope.cli import main

VOCAB = 30


def text_encoder() -> onnx.ModelProto:
    """input_ids/attention_mask [N, S] -> embedding table Gather, masked: a tiny encoder."""
    ids = helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["N", "S"])
    mask = helper.make_tensor_value_info("attention_mask", onnx.TensorProto.INT64, ["N", "S"])
    out = helper.make_tensor_value_info("hidden", onnx.TensorProto.FLOAT, ["N", "S", 8])
    emb = numpy_helper.from_array(
        np.random.default_rng(0).normal(0, 1, (VOCAB, 8)).astype(np.float32), "emb")
    axes = numpy_helper.from_array(np.array([2], np.int64), "axes")
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["e"]),
        helper.make_node("Cast", ["attention_mask"], ["mf"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mf", "axes"], ["m3"]),
        helper.make_node("Mul", ["e", "m3"], ["hidden"]),
    ]
    graph = helper.make_graph(nodes, "enc", [ids, mask], [out], [emb, axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def text_lookup() -> onnx.ModelProto:
    """The encoder above without its mask Mul: the lookup is the only layer (the lookup is
    a group of its own, so the Mul was a token-wise layer for tokensplit to split)."""
    proto = text_encoder()
    gather = proto.graph.node[0]
    del proto.graph.node[1:]
    gather.output[0] = "hidden"
    return proto


def _text_feeds(n_ids=(4, 6), n_mask=(4, 6), high=VOCAB, low=0) -> dict[str, np.ndarray]:
    r = np.random.default_rng(1)
    return {"input_ids": r.integers(low, high, n_ids).astype(np.int64),
            "attention_mask": np.ones(n_mask, np.int64)}


BAD_TOML_CHECK = """
name = "mine"
vendor = "Hailo"
sdk = "x"
precisions = { weighted = ["a8_w8", "a16_w16"], other = ["a8_w8", "a16_w16"] }
[cost]
basis = "guess"
relative = { weighted = { a8_w8 = 1.0, a16_w16 = 2.0 } }
[[rules]]
id = "r1"
check = "no_such_check"
reason = "r"
provenance = "p"
fix = "f"
"""


def _make_ws(ws: Path) -> None:
    """Every input file the cases read (none of them may change)."""
    onnx.save(tm.layernorm_block(), ws / "m.onnx")
    onnx.save(text_encoder(), ws / "text.onnx")
    onnx.save(text_lookup(), ws / "lookup.onnx")
    np.save(ws / "x.npy", np.random.default_rng(0).normal(0, 1, (8, 5, 24)).astype(np.float32))
    assert main(["calibrate", str(ws / "m.onnx"), "--data", str(ws / "x.npy"),
                 "--out", str(ws / "s.npz")]) == 0
    (ws / "p.json").write_text(json.dumps({"default": "a8_w8", "groups": {}}))
    (ws / "r.json").write_text(json.dumps({"metrics": {"cosine_mean": 0.99}}))
    (ws / "a.json").write_text(json.dumps({"format": "quantscope.analysis/1"}))
    (ws / "list.json").write_text("[1, 2]")
    (ws / "a_bogus.json").write_text(json.dumps({"format": "quantscope.analysis/1",
                                                 "bogus": 1}))
    (ws / "latin1.jsonl").write_bytes(b'{"query": "caf\xe9", "document": "d"}\n')
    (ws / "p_reasons.json").write_text(json.dumps({"default": "a8_w8", "reasons": [1]}))
    (ws / "p_meta.json").write_text(json.dumps({"default": "a8_w8", "meta": "x"}))
    (ws / "dep_tensor.json").write_text(json.dumps({"buckets": [
        {"seq_len": 5, "model": "m.onnx", "stats": "s.npz", "plan": "p_target.json"}]}))
    (ws / "p_target.json").write_text(json.dumps({"default": "a8_w8", "target": "hailo8"}))
    (ws / "dep_nobuckets.json").write_text(json.dumps({"bucket": []}))
    (ws / "cands_tensor.json").write_text(json.dumps({"candidates": [
        {"model": "m.onnx", "stats": "s.npz", "plan": "p_target.json"}]}))
    (ws / "empty.onnx").write_bytes(b"")
    onnx.save(tm.conv_net(), ws / "conv.onnx")
    np.save(ws / "conv.npy", np.random.default_rng(0).normal(0, 1, (2, 3, 16, 16)
                                                             ).astype(np.float32))
    assert main(["calibrate", str(ws / "conv.onnx"), "--data", str(ws / "conv.npy"),
                 "--out", str(ws / "cs.npz")]) == 0
    (ws / "empty.npz").write_bytes(b"")
    (ws / "empty.npy").write_bytes(b"")
    (ws / "dir").mkdir()
    (ws / "pairs.jsonl").write_text("".join(
        json.dumps({"query": f"how to sort list {i}", "document": f"sorted() sorts {i}"}) + "\n"
        for i in range(4)))
    (ws / "xs").mkdir()
    np.save(ws / "xs" / "x.npy", np.load(ws / "x.npy"))
    (ws / "script.alls").write_text("quantization_param(x, precision_mode=a8_w8)\n")
    (ws / "bad_check.toml").write_text(BAD_TOML_CHECK)
    (ws / "bad_type.toml").write_text(BAD_TOML_CHECK.replace(
        'precisions = { weighted = ["a8_w8", "a16_w16"], other = ["a8_w8", "a16_w16"] }',
        "precisions = 3"))
    with np.load(ws / "s.npz") as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(ws / "s_missing.npz", **{k: v for k, v in arrays.items() if k != "hist_0"})
    np.savez(ws / "s_noheader.npz", **{k: v for k, v in arrays.items() if k != "header"})
    np.savez(ws / "ids_len.npz", **_text_feeds(n_mask=(4, 7)))
    np.savez(ws / "ids_batch.npz", **_text_feeds(n_mask=(3, 6)))
    np.savez(ws / "ids_vocab.npz", **_text_feeds(low=VOCAB, high=VOCAB + 5))
    np.savez(ws / "ids_negative.npz", **_text_feeds(low=-3, high=-1))
    # issue 32: the last bad inputs
    onnx.save(no_inputs_model(), ws / "noin.onnx")
    onnx.save(tm.layernorm_block(), ws / "ext.onnx", save_as_external_data=True,
              all_tensors_to_one_file=True, location="ext.weights", size_threshold=0)
    (ws / "ext.weights").unlink()  # the model's weights file went missing
    np.save(ws / "x1.npy", np.load(ws / "x.npy")[:1])
    np.savez(ws / "y_named.npz", y=np.load(ws / "x.npy"))
    (ws / "not_a_tokenizer.json").write_text(json.dumps({"vocab": {"a": 0}}))
    (ws / "p_dup.json").write_text('{"default": "a8_w8", "groups": {}, "default": "a16_w16"}')
    # h37: an axis with nothing on it, stats whose header was edited or damaged
    np.save(ws / "x_empty_axis.npy", np.load(ws / "x.npy")[:, :0])
    (ws / "hn.json").write_text(json.dumps({"layers": {}}))  # an HN (of no layer)
    (ws / "x_copy.npy").write_bytes((ws / "x.npy").read_bytes())
    (ws / "one_pair.jsonl").write_text(json.dumps({"query": "q", "document": "d"}) + "\n")
    _damaged_stats(ws / "s.npz", ws / "s_range_nan.npz", min=float("nan"))
    _damaged_stats(ws / "s.npz", ws / "s_upside_down.npz", min=5.0, max=-5.0)
    _damaged_stats(ws / "s.npz", ws / "s_negative_count.npz", count=-1)
    good = (Path(__file__).parents[1] / "src/quantscope/targets/hailo8.toml").read_text()
    for name, old, new in TOML_EDITS:
        assert old in good
        (ws / f"{name}.toml").write_text(good.replace(old, new, 1))


def _damaged_stats(good: Path, out: Path, **edit: float) -> None:
    """``good`` with its second tensor's header entry edited (what no calibration writes)."""
    with np.load(good) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(bytes(arrays["header"]).decode())
    header["tensors"][1].update(edit)
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    np.savez(out, **arrays)


def no_inputs_model() -> onnx.ModelProto:
    """Relu of a constant: a graph with no inputs (its output is a constant)."""
    c = numpy_helper.from_array(np.ones((2, 3), np.float32), "c")
    out = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["c"], ["y"])], "g", [], [out], [c])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


COST = "weighted = { a8_w8 = 1.0,"
TOML_EDITS = [  # (file name, text in hailo8.toml, replacement)
    ("cost_negative", COST, "weighted = { a8_w8 = -1.0,"),
    ("cost_nan", COST, "weighted = { a8_w8 = nan,"),
    ("cost_inf", COST, "weighted = { a8_w8 = inf,"),
    ("boundary_negative", "boundary_macs = 0.5", "boundary_macs = -0.5"),
    ("signed_yes", "act_signed = false", 'act_signed = "yes"'),
]
LONG = "a" * 300  # one path component longer than the 255 bytes a file system allows


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("inputs")
    _make_ws(path)
    return path


def _readonly_folder(out: Path) -> Path:
    """A folder this process cannot write into (root ignores modes: /sys then)."""
    ro = out / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    for folder in (ro, Path("/sys")):
        try:
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError:
            return folder
    pytest.skip("no unwritable folder on this machine")


def _symlink(ws: Path, out: Path) -> Path:
    (out / "link.onnx").symlink_to(ws / "m.onnx")
    return out / "link.onnx"


def _hardlink(ws: Path, out: Path) -> Path:
    os.link(ws / "m.onnx", out / "hard.onnx")
    return out / "hard.onnx"


M, X, S, P = "{ws}/m.onnx", "{ws}/x.npy", "{ws}/s.npz", "{ws}/p.json"
T = "{ws}/text.onnx"
EVAL = ["evaluate", M, "--data", X, "--stats", S, "--precision", "a8_w8"]
QDQ = ["export-qdq", M, "--stats", S, "--precision", "a8_w8"]
REPAIR = ["repair", M, "--data", X, "--stats", S, "--precision", "a8_w8", "--no-evaluate"]
REPAIR_OUT = ["--out-model", "{out}/r.onnx", "--out-stats", "{out}/r.npz",
              "--out-plan", "{out}/r.json"]
ANALYZE = ["analyze", M, "--data", X, "--stats", S]
PLAN = ["plan", M, "--target", "hailo8", "--analysis", "{ws}/a.json"]
CAL = ["calibrate", M, "--data", X]

# (id, argv, needle in the one stderr line); {ws} = inputs, {out} = the output folder,
# {special} = the path a setup function returns (see SETUP)
CASES: list[tuple[str, list[str], str]] = [
    # -- an option's prefix is no option: 'evaluate --out' was taken as '--output' (an
    #    output tensor's name) and refused as "no output of the model"
    ("evaluate-abbreviated-option", [*EVAL, "--out", "{out}/e.json"],
     "unrecognized arguments: --out"),
    # -- an output is an input, or two outputs share one path
    ("calibrate-out-is-data", [*CAL, "--out", X], "is the input data"),
    ("calibrate-out-is-model", [*CAL, "--out", M], "is the input model"),
    ("calibrate-out-in-data-folder", ["calibrate", M, "--data", "{ws}/xs", "--out",
                                      "{ws}/xs/s.npz"], "inside the input data folder"),
    ("export-qdq-out-is-model", [*QDQ, "--out", M], "is the input model"),
    ("export-qdq-out-is-stats", [*QDQ, "--out", S], "is the input stats"),
    ("export-qdq-out-other-spelling", [*QDQ, "--out", "{ws}/dir/../m.onnx"], "is the input"),
    ("export-qdq-out-symlink", [*QDQ, "--out", "{special}"], "is the input model"),
    ("export-qdq-out-hardlink", [*QDQ, "--out", "{special}"], "is the input model"),
    ("export-qdq-to-model", ["export", "--model", M, "--stats", S, P, "--format", "qdq",
                             "--out", M], "is the input model"),
    ("export-alls-out-is-plan", ["export", "--model", M, "--stats", S, P, "--format", "alls",
                                 "--out", P], "is the input plan"),
    ("repair-out-model-is-model", [*REPAIR, "--out-model", M, "--out-stats", "{out}/r.npz",
                                   "--out-plan", "{out}/r.json"], "is the input model"),
    ("repair-out-stats-is-stats", [*REPAIR, "--out-model", "{out}/r.onnx", "--out-stats", S,
                                   "--out-plan", "{out}/r.json"], "is the input stats"),
    ("repair-out-plan-is-data", [*REPAIR, "--out-model", "{out}/r.onnx", "--out-stats",
                                 "{out}/r.npz", "--out-plan", X], "is the input data"),
    ("repair-one-path-for-two", [*REPAIR, "--out-model", "{out}/r.bin", "--out-stats",
                                 "{out}/r.bin", "--out-plan", "{out}/r.json"], "both"),
    ("evaluate-json-is-stats", [*EVAL, "--json", S], "is the input stats"),
    ("analyze-out-is-data", [*ANALYZE, "--out", X], "is the input data"),
    ("plan-out-is-analysis", [*PLAN, "--out", "{ws}/a.json"], "is the input analysis"),
    ("report-out-is-results", ["report", "--results", "{ws}/r.json", "--out", "{ws}/r.json"],
     "is the input results"),
    ("groups-json-is-model", ["groups", M, "--json", M], "is the input model"),
    ("phases-no-cache", ["phases", M, "--out", "{out}/ph"], "no input 'input_ids'"),
    ("images-model-takes-no-images", ["images", "{ws}", "--model", M, "--pixels", "raw",
                                      "--out", "{out}/d.npz"], "no model input takes images"),
    ("images-folder-has-none", ["images", "{ws}", "--model", "{ws}/conv.onnx", "--pixels",
                                "scale=255", "--out", "{out}/d.npz"], "has no images"),
    ("images-pixels-unknown-key", ["images", "{ws}", "--model", "{ws}/conv.onnx", "--pixels",
                                   "gamma=2", "--out", "{out}/d.npz"], "not understood"),
    ("images-out-not-npz", ["images", "{ws}", "--model", "{ws}/conv.onnx", "--pixels", "raw",
                            "--out", "{out}/d.npy"], "not a .npz file"),
    ("phases-name-is-a-path", ["phases", M, "--out", "{out}/ph", "--name", "a/b"],
     "no plain file name"),
    ("tokensplit-chunk-not-below", ["tokensplit", T, "--seq-len", "8", "--chunk", "8",
                                    "--out", "{out}/s.onnx"], "below --seq-len"),
    ("tokensplit-image-model", ["tokensplit", M, "--seq-len", "8", "--out", "{out}/s.onnx"],
     "no rank-2 token input"),
    ("tokensplit-nothing-to-split", ["tokensplit", "{ws}/lookup.onnx", "--seq-len", "8",
                                     "--out", "{out}/s.onnx"], "nothing written"),
    ("tokensplit-out-is-model", ["tokensplit", T, "--seq-len", "8", "--out", T],
     "never overwritten"),
    ("headsplit-nothing-to-split", ["headsplit", T, "--out", "{out}/s.onnx"],
     "no multi-head attention"),
    ("headsplit-image-model-seq-len", ["headsplit", M, "--seq-len", "8",
                                       "--out", "{out}/s.onnx"], "no rank-2 token input"),
    ("headsplit-out-is-model", ["headsplit", T, "--out", T], "never overwritten"),
    ("outscale-nothing-to-rescale", ["outscale", T, "--stats", S, "--out", "{out}/o.onnx"],
     "no residual-branch Linear"),
    ("peel-nothing-to-peel", ["peel", T, "--stats", S, "--out", "{out}/p.onnx"],
     "no FFN hidden channel"),
    ("whatif-nothing-below-16-bit", ["whatif", M, "--data", X, "--stats", S, "--precision",
                                     "a16_w16"], "nothing to lift"),
    ("rowscale-nothing-to-scale", ["rowscale", M, "--out", "{out}/r.onnx"],
     "no attention Softmax"),
    ("rowscale-growth-below-one", ["rowscale", T, "--growth", "0.5", "--out", "{out}/r.onnx"],
     "below 1"),
    ("rotate-not-a-decoder", ["rotate", T, "--out", "{out}/r.onnx"],
     "no RMSNormalization in the graph: not an RMSNorm decoder"),
    ("vrotate-no-value-heads", ["vrotate", T, "--out", "{out}/v.onnx"],
     "no value heads to rotate"),
    ("smooth-not-a-decoder", ["smooth", T, "--stats", S, "--out", "{out}/s.onnx"],
     "no gated MLP"),
    ("gatedsplit-not-a-decoder", ["gatedsplit", T, "--seq-len", "8", "--out", "{out}/g.onnx"],
     "no gated MLP"),
    ("demo-json-and-report-one-path", ["demo", "--model", M, "--data", X, "--json",
                                       "{out}/d.x", "--report", "{out}/d.x"], "both"),
    # -- outputs that cannot be written: refused before any work
    ("calibrate-out-is-folder", [*CAL, "--out", "{out}"], "is a folder"),
    ("calibrate-out-missing-folder", [*CAL, "--out", "{out}/no/s.npz"], "does not exist"),
    ("calibrate-out-under-a-file", [*CAL, "--out", "{ws}/x.npy/s.npz"], "is not a folder"),
    ("demo-report-read-only", ["demo", "--model", M, "--data", X, "--report",
                               "{special}/r.html"], "cannot write"),
    ("models-json-is-folder", ["models", "--json", "{out}"], "is a folder"),
    ("evaluate-json-missing-folder", [*EVAL, "--json", "{out}/no/r.json"], "does not exist"),
    # -- numeric flags out of range
    ("evaluate-pairs-negative", [*EVAL, "--pairs", "-5"], "--pairs"),
    ("evaluate-pairs-text", [*EVAL, "--pairs", "many"], "not a number"),
    ("analyze-proxy-zero", [*ANALYZE, "--proxy", "0", "--out", "{out}/a.json"], "(0, 1]"),
    ("analyze-proxy-negative", [*ANALYZE, "--proxy", "-1", "--out", "{out}/a.json"], "(0, 1]"),
    ("analyze-proxy-seven", [*ANALYZE, "--proxy", "7", "--out", "{out}/a.json"], "(0, 1]"),
    ("analyze-proxy-nan", [*ANALYZE, "--proxy", "nan", "--out", "{out}/a.json"], "finite"),
    ("plan-seq-len-zero", [*PLAN, "--seq-len", "0", "--out", "{out}/p.json"], "--seq-len"),
    ("plan-seq-len-negative", [*PLAN, "--seq-len", "-5", "--out", "{out}/p.json"], "--seq-len"),
    ("check-seq-len-text", ["check", "--model", M, "--target", "hailo8", "--seq-len", "x", P],
     "not a number"),
    ("lint-seq-len-negative", ["lint", "--model", M, "--target", "hailo8", "--seq-len", "-1",
                               "{ws}/script.alls"], "--seq-len"),
    ("repair-batches-negative", [*REPAIR, "--batches", "-1", *REPAIR_OUT], "--batches"),
    ("repair-batches-zero", [*REPAIR, "--batches", "0", *REPAIR_OUT], "--batches"),
    ("plan-max-cost-negative", [*PLAN, "--max-cost", "-1", "--out", "{out}/p.json"],
     "--max-cost"),
    ("plan-max-cost-nan", [*PLAN, "--max-cost", "nan", "--out", "{out}/p.json"], "finite"),
    ("plan-max-cost-inf", [*PLAN, "--max-cost", "inf", "--out", "{out}/p.json"], "finite"),
    ("plan-min-quality-negative", [*PLAN, "--min-quality", "-3", "--out", "{out}/p.json"],
     "--min-quality"),
    ("plan-goal-above-one", [*PLAN, "--metric", "top1_agreement", "--goal", "2", "--out",
                             "{out}/p.json"], "outside"),
    ("plan-goal-nan", [*PLAN, "--goal", "nan", "--out", "{out}/p.json"], "finite"),
    ("plan-repair-batches-zero", [*PLAN, "--repair-batches", "0", "--out", "{out}/p.json"],
     "--repair-batches"),
    ("analyze-low-above-high", [*ANALYZE, "--low", "a16_w16", "--high", "a8_w8", "--out",
                                "{out}/a.json"], "not above"),
    ("analyze-low-equals-high", [*ANALYZE, "--low", "a16_w8", "--high", "a16_w8", "--out",
                                 "{out}/a.json"], "not above"),
    ("analyze-unknown-low", [*ANALYZE, "--low", "a7_w7", "--out", "{out}/a.json"],
     "unknown precision"),
    ("export-qdq-unknown-precision", ["export-qdq", M, "--stats", S, "--precision", "a12_w3",
                                      "--out", "{out}/q.onnx"], "unknown precision"),
    # -- bad data
    ("calibrate-zero-byte-npz", ["calibrate", M, "--data", "{ws}/empty.npz", "--out",
                                 "{out}/s.npz"], "empty (0 bytes)"),
    ("calibrate-zero-byte-npy", ["calibrate", M, "--data", "{ws}/empty.npy", "--out",
                                 "{out}/s.npz"], "empty (0 bytes)"),
    ("calibrate-seq-lengths-disagree", ["calibrate", T, "--data", "{ws}/ids_len.npz",
                                        "--out", "{out}/s.npz"], "dimension 'S'"),
    ("calibrate-batch-sizes-disagree", ["calibrate", T, "--data", "{ws}/ids_batch.npz",
                                        "--out", "{out}/s.npz"], "sample count"),
    ("calibrate-ids-beyond-vocab", ["calibrate", T, "--data", "{ws}/ids_vocab.npz",
                                    "--out", "{out}/s.npz"], f"outside 0..{VOCAB - 1}"),
    ("calibrate-ids-negative", ["calibrate", T, "--data", "{ws}/ids_negative.npz",
                                "--out", "{out}/s.npz"], f"outside 0..{VOCAB - 1}"),
    ("calibrate-tokenizer-not-the-models", ["calibrate", T, "--data", "{ws}/pairs.jsonl",
                                           "--out", "{out}/s.npz"],
     f"table of {VOCAB} rows, not the 30,522 of the packaged one (uncased BERT): pass "
     "--tokenizer"),
    ("calibrate-pairs-not-utf8", ["calibrate", T, "--data", "{ws}/latin1.jsonl", "--out",
                                  "{out}/s.npz"], "not UTF-8"),
    ("calibrate-missing-text-file", ["calibrate", M, "--data", "{ws}/nope.txt", "--out",
                                     "{out}/s.npz"], "does not exist"),
    ("calibrate-model-is-folder", ["calibrate", "{ws}/dir", "--data", X, "--out",
                                   "{out}/s.npz"], "is a folder"),
    # -- bad stats
    ("export-qdq-zero-byte-stats", ["export-qdq", M, "--stats", "{ws}/empty.npz",
                                    "--precision", "a8_w8", "--out", "{out}/q.onnx"],
     "not a quantscope stats file"),
    ("export-qdq-stats-missing-array", ["export-qdq", M, "--stats", "{ws}/s_missing.npz",
                                        "--precision", "a8_w8", "--out", "{out}/q.onnx"],
     "damaged"),
    ("io-stats-without-header", ["io", M, "--stats", "{ws}/s_noheader.npz", "--precision",
                                 "a8_w8"], "not a quantscope stats file"),
    ("io-stats-is-folder", ["io", M, "--stats", "{ws}/dir", "--precision", "a8_w8"],
     "is a folder"),
    ("io-stats-missing", ["io", M, "--stats", "{ws}/nope.npz", "--precision", "a8_w8"],
     "calibrate"),
    # -- plans and other JSON inputs
    ("check-plan-is-folder", ["check", "--model", M, "--target", "hailo8", "{ws}/dir"],
     "is a folder"),
    ("evaluate-plan-is-folder", [*EVAL[:6], "--plan", "{ws}/dir"], "is a folder"),
    ("export-plan-missing", ["export", "--model", M, "--stats", S, "{ws}/nope.json",
                             "--format", "qnn", "--out", "{out}/e.json"], "does not exist"),
    ("export-hn-missing", ["export", "--model", M, "--stats", S, P, "--format", "alls",
                           "--hn", "{ws}/nope.json", "--out", "{out}/e.alls"],
     "does not exist"),
    ("export-hn-not-an-object", ["export", "--model", M, "--stats", S, P, "--format", "alls",
                                 "--hn", "{ws}/list.json", "--out", "{out}/e.alls"],
     "no Hailo HN"),
    ("export-plan-reasons-not-object", ["export-qdq", M, "--stats", S, "--plan",
                                        "{ws}/p_reasons.json", "--out", "{out}/q.onnx"],
     "'reasons'"),
    ("evaluate-plan-meta-not-object", [*EVAL[:6], "--plan", "{ws}/p_meta.json"], "'meta'"),
    ("check-plan-given-results", ["check", "--model", M, "--target", "hailo8",
                                  "{ws}/r.json"], "unknown key 'metrics'"),
    ("lint-empty-script", ["lint", "--model", M, "--target", "hailo8", "{ws}/empty.npy"],
     "is empty"),
    ("export-qdq-stats-of-another-model", ["export-qdq", M, "--stats", "{ws}/cs.npz",
                                           "--precision", "a8_w8", "--out", "{out}/q.onnx"],
     "another model"),
    ("calibrate-model-zero-bytes", ["calibrate", "{ws}/empty.onnx", "--data", X, "--out",
                                    "{out}/s.npz"], "ONNX"),
    ("groups-model-is-data", ["groups", X], "ONNX"),
    ("report-results-given-a-plan", ["report", "--results", P, "--out", "{out}/r.html"],
     "is a plan file"),
    ("report-analysis-given-a-plan", ["report", "--analysis", P, "--out", "{out}/r.html"],
     "is a plan file"),
    ("report-plan-given-results", ["report", "--plan", "{ws}/r.json", "--out",
                                   "{out}/r.html"], "is a results file"),
    ("report-results-not-quantscope", ["report", "--results", "{ws}/list.json", "--out",
                                       "{out}/r.html"], "no quantscope results file"),
    ("report-model-without-stats", ["report", "--model", M, "--plan", P, "--out",
                                    "{out}/r.html"], "add --stats"),
    ("report-stats-without-model", ["report", "--stats", S, "--results", "{ws}/r.json",
                                    "--out", "{out}/r.html"], "--model"),
    ("report-analysis-incomplete", ["report", "--analysis", "{ws}/a.json", "--out",
                                    "{out}/r.html"], "run 'quantscope analyze' again"),
    ("report-analysis-unknown-key", ["report", "--analysis", "{ws}/a_bogus.json", "--out",
                                     "{out}/r.html"], "unknown key 'bogus'"),
    ("report-nothing", ["report", "--out", "{out}/r.html"], "nothing to report"),
    # -- targets and scripts
    ("check-target-unknown-check", ["check", "--model", M, "--target",
                                    "{ws}/bad_check.toml", P], "unknown check"),
    ("analyze-target-unknown-check", [*ANALYZE, "--target", "{ws}/bad_check.toml", "--out",
                                      "{out}/a.json"], "unknown check"),
    ("check-target-wrong-type", ["check", "--model", M, "--target", "{ws}/bad_type.toml", P],
     "wrong type"),
    ("check-target-is-folder", ["check", "--model", M, "--target", "{ws}/dir", P],
     "is a folder"),
    ("check-target-unknown-name", ["check", "--model", M, "--target", "hailo99", P],
     "unknown target"),
    ("lint-hailo-script-on-qnn", ["lint", "--model", M, "--target", "qnn-htp-v73",
                                  "{ws}/script.alls"], "Hailo"),
    ("lint-script-missing", ["lint", "--model", M, "--target", "hailo8", "{ws}/nope.alls"],
     "does not exist"),
    # -- route (length buckets)
    ("route-deployment-missing", ["route", M, "--data", X, "--deployment", "{ws}/nope.json"],
     "does not exist"),
    ("route-deployment-no-buckets", ["route", M, "--data", X, "--deployment",
                                     "{ws}/dep_nobuckets.json"], "no 'buckets' list"),
    ("route-on-tensor-data", ["route", M, "--data", X, "--deployment", "{ws}/dep_tensor.json"],
     "route needs text data"),
    ("buckets-candidates-missing", ["buckets", M, "--data", X, "--candidates", "{ws}/nope.json",
                                    "--max-cost", "1.5", "--out", "{out}/d.json"],
     "does not exist"),
    ("buckets-on-tensor-data", ["buckets", M, "--data", X, "--candidates",
                                "{ws}/cands_tensor.json", "--max-cost", "1.5", "--out",
                                "{out}/d.json"], "buckets needs text data"),
    ("buckets-max-cost-missing", ["buckets", M, "--data", X, "--candidates",
                                  "{ws}/cands_tensor.json", "--out", "{out}/d.json"],
     "--max-cost"),
    # -- demo on what it cannot measure
    ("demo-on-tensor-data", ["demo", "--model", M, "--data", X], "retrieval"),
    # -- run
    ("run-out-is-a-file", ["run", M, "--data", X, "--target", "hailo8", "--out", M],
     "is a file"),
    ("run-out-parent-missing", ["run", M, "--data", X, "--target", "hailo8", "--out",
                                "{out}/no/w"], "does not exist"),
    ("run-max-cost-negative", ["run", M, "--data", X, "--target", "hailo8", "--max-cost",
                               "-1", "--out", "{out}/w"], "--max-cost"),
    ("run-force-unknown-stage", ["run", M, "--data", X, "--target", "hailo8", "--force",
                                 "nope", "--out", "{out}/w"], "--force"),
    ("run-out-not-writable", ["run", M, "--data", X, "--target", "hailo8", "--out",
                              "/proc/quantscope-run"], "cannot make a folder in '/proc'"),
    ("run-missing-data", ["run", M, "--data", "{ws}/nope.npz", "--target", "hailo8",
                          "--out", "{out}/w"], "does not exist"),
    ("run-decoder-option-on-an-encoder", ["run", M, "--data", X, "--target", "hailo8",
                                          "--prompts", "4", "--out", "{out}/w"],
     "--prompts: for a decoder LLM's run only"),
    ("demo-on-non-text-model", ["demo", "--model", M], "sentence-encoder"),
    # -- the command line itself
    ("calibrate-unknown-method", [*CAL, "--method", "best", "--out", "{out}/s.npz"],
     "invalid choice"),
    ("calibrate-missing-out", CAL, "--out"),
    ("unknown-command", ["calibrat", M], "invalid choice"),
    # -- issue 32: special files are neither read (a FIFO blocks forever) nor replaced
    ("export-qdq-out-fifo", [*QDQ, "--out", "{special}"], "FIFO"),
    ("calibrate-out-char-device", [*CAL, "--out", "{special}"], "character device"),
    ("calibrate-model-fifo", ["calibrate", "{special}", "--data", X, "--out", "{out}/s.npz"],
     "FIFO"),
    ("calibrate-data-fifo", ["calibrate", M, "--data", "{special}", "--out", "{out}/s.npz"],
     "FIFO"),
    ("check-plan-fifo", ["check", "--model", M, "--target", "hailo8", "{special}"], "FIFO"),
    # -- names longer than a file system allows, symlink loops, missing link targets
    ("calibrate-model-name-too-long", ["calibrate", f"{{ws}}/{LONG}.onnx", "--data", X,
                                       "--out", "{out}/s.npz"], "longer than the file system"),
    ("calibrate-data-name-too-long", ["calibrate", M, "--data", f"{{ws}}/{LONG}/x.npy",
                                      "--out", "{out}/s.npz"], "longer than the file system"),
    ("calibrate-out-name-too-long", [*CAL, "--out", f"{{out}}/{LONG}.npz"],
     "longer than the file system"),
    ("run-out-name-too-long", ["run", M, "--data", X, "--target", "hailo8", "--out",
                               f"{{out}}/{LONG}"], "longer than the file system"),
    ("calibrate-model-symlink-loop", ["calibrate", "{special}", "--data", X, "--out",
                                      "{out}/s.npz"], "symlink loop"),
    ("calibrate-data-symlink-loop", ["calibrate", M, "--data", "{special}", "--out",
                                     "{out}/s.npz"], "symlink loop"),
    ("calibrate-model-dangling-symlink", ["calibrate", "{special}", "--data", X, "--out",
                                          "{out}/s.npz"], "which does not exist"),
    ("calibrate-out-trailing-slash", [*CAL, "--out", "{out}/new/"], "ends in '/'"),
    # -- models: no inputs, external weights missing
    ("calibrate-model-no-inputs", ["calibrate", "{ws}/noin.onnx", "--data", X, "--out",
                                   "{out}/s.npz"], "has no inputs"),
    ("groups-model-external-data-missing", ["groups", "{ws}/ext.onnx"],
     "external data file 'ext.weights'"),
    # -- a JSON that is no tokenizer, a plan giving a key twice
    ("calibrate-tokenizer-not-a-tokenizer", ["calibrate", T, "--data", "{ws}/pairs.jsonl",
                                             "--tokenizer", "{ws}/not_a_tokenizer.json",
                                             "--out", "{out}/s.npz"], "no tokenizer"),
    ("check-plan-duplicate-key", ["check", "--model", M, "--target", "hailo8",
                                  "{ws}/p_dup.json"], "key 'default' twice"),
    ("export-qdq-plan-duplicate-key", ["export-qdq", M, "--stats", S, "--plan",
                                       "{ws}/p_dup.json", "--out", "{out}/q.onnx"],
     "key 'default' twice"),
    # -- target profiles: costs finite and positive, a string is not a bool
    *[(f"check-target-{name.replace('_', '-')}", ["check", "--model", M, "--target",
                                                  f"{{ws}}/{name}.toml", P], needle)
      for name, needle in (("cost_negative", "cost.relative.weighted.a8_w8"),
                           ("cost_nan", "finite number above 0"),
                           ("cost_inf", "finite number above 0"),
                           ("boundary_negative", "cost.boundary_macs"),
                           ("signed_yes", "scheme.act_signed"))],
    # -- options: --input-shape once per input, --seq-len holds the special tokens
    ("check-input-shape-contradictory", ["check", "--model", M, "--target", "hailo8",
                                         "--input-shape", "x=1x5x24", "--input-shape",
                                         "x=2x5x24", P], "twice, as 1x5x24 and as 2x5x24"),
    ("check-input-shape-repeated", ["check", "--model", M, "--target", "hailo8",
                                    "--input-shape", "x=1x5x24", "--input-shape", "x=1x5x24",
                                    P], "'x' twice"),
    ("plan-seq-len-one", [*PLAN, "--seq-len", "1", "--out", "{out}/p.json"],
     "special tokens"),
    ("evaluate-seq-len-one", [*EVAL, "--seq-len", "1"], "special tokens"),
    ("run-seq-len-one", ["run", M, "--data", X, "--target", "hailo8", "--seq-len", "1",
                         "--out", "{out}/w"], "special tokens"),
    # -- run: every input checked before any work, no folder left behind
    ("run-one-sample", ["run", M, "--data", "{ws}/x1.npy", "--target", "hailo8", "--out",
                        "{out}/w"], "at least 2"),
    ("run-eval-data-wrong-input", ["run", M, "--data", X, "--eval-data", "{ws}/y_named.npz",
                                   "--target", "hailo8", "--out", "{out}/w"],
     "no array for model input 'x'"),
    ("analyze-one-sample", ["analyze", M, "--data", "{ws}/x1.npy", "--stats", S, "--out",
                            "{out}/a.json"], "at least 2 samples"),
    ("calibrate-data-folder-holds-fifo", ["calibrate", M, "--data", "{special}", "--out",
                                          "{out}/s.npz"], "not a regular file"),
    ("run-target-bad-cost", ["run", M, "--data", X, "--target", "{ws}/cost_nan.toml",
                             "--out", "{out}/w"], "finite number above 0"),
    # -- h37: data with an empty axis was an internal error (a division by zero in
    #    calibrate), and in --eval-data it left a run folder behind
    ("calibrate-data-empty-axis", ["calibrate", M, "--data", "{ws}/x_empty_axis.npy", "--out",
                                   "{out}/s.npz"], "axis 1 (the model's 'S') is empty"),
    ("evaluate-data-empty-axis", ["evaluate", M, "--data", "{ws}/x_empty_axis.npy", "--stats",
                                  S, "--precision", "a8_w8"], "is empty (0 long)"),
    ("run-eval-data-empty-axis", ["run", M, "--data", X, "--eval-data",
                                  "{ws}/x_empty_axis.npy", "--target", "hailo8", "--out",
                                  "{out}/w"], "is empty (0 long)"),
    # -- h37: a stats file with a range no calibration writes quantized silently wrong
    ("export-qdq-stats-range-nan", ["export-qdq", M, "--stats", "{ws}/s_range_nan.npz",
                                    "--precision", "a8_w8", "--out", "{out}/q.onnx"],
     "is damaged (tensor 'n1' has the range nan .. "),
    ("evaluate-stats-range-upside-down", [*EVAL[:4], "--stats", "{ws}/s_upside_down.npz",
                                          "--precision", "a8_w8"], "the range 5 .. -5"),
    ("io-stats-negative-count", ["io", M, "--stats", "{ws}/s_negative_count.npz",
                                 "--precision", "a8_w8"], "negative count"),
    # -- h37: run read --hn at its export stage, after every stage before it had written
    #    its files; a text option on tensor data was silently unused; a target-less plan
    #    exported for --target hailo8 as a Qualcomm file
    ("run-hn-not-json", ["run", M, "--data", X, "--target", "hailo8", "--hn", X, "--out",
                         "{out}/w"], "is not valid JSON"),
    ("run-hn-no-layers", ["run", M, "--data", X, "--target", "hailo8", "--hn",
                          "{ws}/list.json", "--out", "{out}/w"], "no 'layers' table"),
    ("run-hn-on-a-qnn-target", ["run", M, "--data", X, "--target", "qnn-htp-v73", "--hn",
                                "{ws}/hn.json", "--out", "{out}/w"],
     "--target qnn-htp-v73 (Qualcomm) writes no .alls: leave --hn out"),
    ("export-hn-on-qnn-format", ["export", "--model", M, "--stats", S, P, "--format", "qnn",
                                 "--hn", "{ws}/hn.json", "--out", "{out}/e.json"],
     "--format qnn writes no .alls: leave --hn out"),
    # -- h37: --eval-data that is --data (or a copy of it) was measured and called held out
    ("run-eval-data-is-the-data", ["run", M, "--data", X, "--eval-data", X, "--target",
                                   "hailo8", "--out", "{out}/w"],
     "holds the same data as --data"),
    ("run-eval-data-is-a-copy-of-the-data", ["run", M, "--data", X, "--eval-data",
                                             "{ws}/x_copy.npy", "--target", "hailo8", "--out",
                                             "{out}/w"], "would not be held out"),
    # -- h37: one retrieval pair: top-1 among one document is always right (a 100 %)
    ("evaluate-pairs-one", [*EVAL, "--pairs", "1"],
     "1 pair: top-1 retrieval among one document is always right: give 2 or more"),
    ("calibrate-one-retrieval-pair", ["calibrate", T, "--data", "{ws}/one_pair.jsonl",
                                      "--out", "{out}/s.npz"],
     "one_pair.jsonl: one query/document pair: give 2 or more"),
    # -- h37: a --pixels key given twice: the last won, silently
    ("images-pixels-key-twice", ["images", "{ws}", "--model", "{ws}/conv.onnx", "--pixels",
                                 "scale=255,mean=0.5,scale=1", "--out", "{out}/d.npz"],
     "gives scale twice: give it once"),
    ("calibrate-tokenizer-on-tensor-data", [*CAL, "--tokenizer", "{ws}/not_a_tokenizer.json",
                                            "--out", "{out}/s.npz"],
     "--tokenizer applies to text data"),
    ("run-tokenizer-on-tensor-data", ["run", M, "--data", X, "--target", "hailo8",
                                      "--tokenizer", "{ws}/not_a_tokenizer.json", "--out",
                                      "{out}/w"], "--tokenizer applies to text data"),
    ("export-format-of-another-vendor-than-target", ["export", "--model", M, "--stats", S, P,
                                                     "--format", "qnn", "--target", "hailo8",
                                                     "--out", "{out}/e.json"],
     "--target hailo8 is a Hailo target, and --format qnn writes a Qualcomm file"),
    # -- h37: a --seq-len or compiled length no NPU compiles (an extra zero or three): a
    #    model with no position table to refuse it was run at that length until the
    #    machine ran out of memory (run at 10**9 tokens: 15 GB in 38 s, then killed)
    ("check-seq-len-beyond-any-npu", ["check", "--model", M, "--target", "hailo8",
                                      "--seq-len", "100000", P],
     "100000 tokens is longer than quantscope runs a model at (65536"),
    ("tokensplit-seq-len-beyond-any-npu", ["tokensplit", T, "--seq-len", "100000",
                                           "--out", "{out}/s.onnx"], "longer than quantscope"),
    ("check-input-shape-tokens-beyond-any-npu", ["check", "--model", T, "--target", "hailo8",
                                                 "--input-shape", "input_ids=1x100000", P],
     "input_ids=1x100000: 100000 tokens is longer than quantscope runs a model at"),
    ("run-lengths-beyond-any-npu", ["run", M, "--data", X, "--target", "hailo8", "--lengths",
                                    "8,100000", "--out", "{out}/w"], "longer than quantscope"),
]

def _fifo(ws: Path, out: Path) -> Path:
    os.mkfifo(out / "pipe")
    return out / "pipe"


def _char_device(ws: Path, out: Path) -> Path:
    """A character device like /dev/null, made in the output folder (root only)."""
    try:
        os.mknod(out / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root")
    return out / "null"


def _loop(ws: Path, out: Path) -> Path:
    (out / "a.onnx").symlink_to(out / "b.onnx")
    (out / "b.onnx").symlink_to(out / "a.onnx")
    return out / "a.onnx"


def _dangling(ws: Path, out: Path) -> Path:
    (out / "gone.onnx").symlink_to(out / "moved.onnx")
    return out / "gone.onnx"


def _folder_with_fifo(ws: Path, out: Path) -> Path:
    (out / "data").mkdir()
    np.save(out / "data" / "a.npy", np.load(ws / "x.npy"))
    os.mkfifo(out / "data" / "b.npy")
    return out / "data"


SETUP = {
    "calibrate-data-folder-holds-fifo": _folder_with_fifo,
    "export-qdq-out-fifo": _fifo,
    "calibrate-out-char-device": _char_device,
    "calibrate-model-fifo": _fifo,
    "calibrate-data-fifo": _fifo,
    "check-plan-fifo": _fifo,
    "calibrate-model-symlink-loop": _loop,
    "calibrate-data-symlink-loop": _loop,
    "calibrate-model-dangling-symlink": _dangling,
    "export-qdq-out-symlink": _symlink,
    "export-qdq-out-hardlink": _hardlink,
    "demo-report-read-only": lambda ws, out: _readonly_folder(out),
}


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): _kind(p) for p in sorted(folder.rglob("*"))}


def _kind(p: Path) -> str:
    """A file's digest, or what else it is (a FIFO is never opened: it would block)."""
    mode = p.lstat().st_mode
    if stat.S_ISLNK(mode):
        return f"link to {os.readlink(p)}"
    if stat.S_ISREG(mode):
        return hashlib.sha256(p.read_bytes()).hexdigest()
    return "dir" if stat.S_ISDIR(mode) else f"special {stat.S_IFMT(mode)}"


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_corpus_is_large_and_covers_every_command():
    from quantscope.cli import COMMANDS

    assert len(CASES) >= 60
    assert len({c[0] for c in CASES}) == len(CASES)
    covered = {argv[0] for _, argv, _ in CASES}
    assert set(COMMANDS) - covered == set()


@pytest.mark.parametrize(("argv", "needle"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(ws, tmp_path, capsys, request, argv, needle):
    out = tmp_path / "out"
    out.mkdir()
    case = request.node.callspec.id
    special = SETUP[case](ws, out) if case in SETUP else ""
    special_kind = _kind(Path(special)) if special else ""
    before, listed = _snapshot(ws), _listing(out)
    code = main([a.format(ws=ws, out=out, special=special) for a in argv])
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    assert lines[0].startswith("quantscope: error: ") and needle in lines[0], lines[0]
    assert lines[0].count("--help')") <= 1, lines[0]  # h37: "(see ...)" was said twice
    assert _listing(out) == listed, "an output was created"
    assert _snapshot(ws) == before, "an input was modified"
    if special:  # a FIFO, a device or a link is still what it was
        assert _kind(Path(special)) == special_kind, "a special file was replaced"


def test_broken_pipe_exits_quietly(ws):
    """`quantscope io ... | head`: the reader is gone before the first line is written.

    No BrokenPipeError message, no traceback, the exit code of a finished command."""
    read, write = os.pipe()
    os.close(read)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "quantscope", "io", str(ws / "m.onnx"), "--stats",
             str(ws / "s.npz"), "--precision", "a16_w16"],
            stdout=write, stderr=subprocess.PIPE, text=True, env=env, check=False)
    finally:
        os.close(write)
    assert proc.stderr == "" and proc.returncode == 0, proc.stderr


def test_repair_writes_its_outputs_as_a_set(tmp_path, monkeypatch):
    """A failure while renaming the third file puts the first two back as they were."""
    from quantscope import serde

    (tmp_path / "a").write_text("old a")
    real = os.replace
    calls = []

    def failing(src, dst):
        calls.append(dst)
        if str(dst).endswith("c") and not str(src).endswith(".old"):
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(serde.os, "replace", failing)
    with pytest.raises(OSError):
        serde.write_atomic_set([(tmp_path / n, serde.text_writer(f"new {n}")) for n in "abc"])
    assert _listing(tmp_path) == ["a"]
    assert (tmp_path / "a").read_text() == "old a"
    monkeypatch.setattr(serde.os, "replace", real)
    serde.write_atomic_set([(tmp_path / n, serde.text_writer(f"new {n}")) for n in "abc"])
    assert [(tmp_path / n).read_text() for n in "abc"] == ["new a", "new b", "new c"]
    assert _listing(tmp_path) == ["a", "b", "c"]


def test_target_check_names_are_the_planner_checks():
    from quantscope.plan.check import CHECKS
    from quantscope.targets.profile import CHECK_NAMES

    assert set(CHECK_NAMES) == set(CHECKS)


# options that name no file (free text or a choice); every other value is typed, so a path
# argument added later cannot escape check_paths without a test failing here
FREE_TEXT = {"repairs", "metric", "title", "allow_warning", "prompt_head"}


def test_every_argument_is_typed():
    from quantscope.cli.commands import parser
    from quantscope.cli.types import output_file

    action = next(a for a in parser()._actions if a.dest == "command")
    untyped, outputs = [], []
    for name, sub in action.choices.items():
        for a in sub._actions:
            if a.dest == "help" or a.nargs == 0 or a.choices or a.dest in FREE_TEXT:
                continue
            if a.type is None:
                untyped.append(f"{name} {a.dest}")
            is_output = a.dest in ("out", "json", "report") or a.dest.startswith("out_")
            if is_output != (a.type is output_file):
                outputs.append(f"{name} {a.dest}")
    assert untyped == [] and outputs == []


def test_demo_writes_json_and_report_as_a_set(tmp_path, monkeypatch, capsys):
    """demo on a tiny text encoder: both files, or (the report failing) neither."""
    import quantscope.report as report

    model = text_encoder()
    emb = next(t for t in model.graph.initializer if t.name == "emb")
    emb.CopyFrom(numpy_helper.from_array(  # room for the packaged BERT tokenizer's ids
        np.random.default_rng(0).normal(0, 1, (30522, 8)).astype(np.float32), "emb"))
    onnx.save(model, tmp_path / "enc.onnx")
    tm.write_pairs(tmp_path / "pairs.jsonl", 6)
    argv = ["demo", "--model", str(tmp_path / "enc.onnx"), "--data",
            str(tmp_path / "pairs.jsonl"), "--json", str(tmp_path / "d.json"), "--report",
            str(tmp_path / "d.html")]
    monkeypatch.setattr(report, "report_html", lambda *a, **k: 1 / 0)
    assert main(argv) == 3
    assert not (tmp_path / "d.json").exists() and not (tmp_path / "d.html").exists()
    monkeypatch.undo()
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "d.json").read_text())["results"]
    assert (tmp_path / "d.html").read_text().startswith("<!doctype html>")
    assert _listing(tmp_path) == ["d.html", "d.json", "enc.onnx", "pairs.jsonl"]


def test_upper_case_npz_suffix_is_read(ws, tmp_path):
    """``X.NPZ`` is an .npz file (saved on a case-insensitive system, say)."""
    with (tmp_path / "X.NPZ").open("wb") as f:
        np.savez(f, x=np.load(ws / "x.npy"))
    assert main(["calibrate", str(ws / "m.onnx"), "--data", str(tmp_path / "X.NPZ"),
                 "--out", str(tmp_path / "s.npz")]) == 0
    assert (tmp_path / "s.npz").stat().st_size > 0


@pytest.fixture
def full_disk(tmp_path):
    """A real 64 KiB file system (tmpfs; mounting needs root), filled to the last byte."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("this machine cannot mount a tmpfs")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.parametrize("command", ["export-qdq", "run"])
def test_disk_full_is_one_line_and_leaves_no_partial_file(ws, full_disk, capsys, command):
    """ENOSPC while writing: one line naming the path and the fix, exit 2, no temp file."""
    if command == "export-qdq":
        argv = [*QDQ, "--out", str(full_disk / "q.onnx")]
    else:
        argv = ["run", M, "--data", X, "--target", "hailo8", "--out", str(full_disk / "w")]
    with (full_disk / "filler").open("wb", buffering=0) as f:  # fill it to the last byte
        with pytest.raises(OSError):
            while True:
                f.write(b"\0" * 1024)
    before = _listing(full_disk)
    code = main([a.format(ws=ws, out=full_disk) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("quantscope:")]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    assert err.strip().splitlines()[-1] == lines[0]  # progress lines before it, none after
    assert "no space left on the device" in lines[0] and "free some space" in lines[0]
    left = [p for p in _listing(full_disk) if p not in before]
    assert not [p for p in left if p.endswith(".tmp")], left  # no half-written file
    if command == "export-qdq":
        assert left == []


def test_ctrl_c_during_the_imports_is_one_line(ws):
    """A real SIGINT while the CLI is still importing (numpy, onnx): exit 130, one line.

    The signal is raised by an import hook the moment numpy is first imported, i.e. in
    the first second of ``python -m quantscope``, before any command runs."""
    hook = (
        "import os, signal, sys, runpy\n"
        "class Hook:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'numpy':\n"
        "            sys.meta_path.remove(self)\n"
        "            signal.raise_signal(signal.SIGINT)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Hook())\n"
        "sys.argv = ['quantscope', 'groups', sys.argv[1]]\n"
        "runpy.run_module('quantscope', run_name='__main__', alter_sys=True)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # the child starts with SIGINT at its default (a shell's background job, e.g. `nohup
    # make test &`, ignores it, and an ignored SIGINT would be inherited and never raised)
    proc = subprocess.run([sys.executable, "-c", hook, str(ws / "m.onnx")], env=env,
                          capture_output=True, text=True, check=False, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == "quantscope: interrupted", proc.stderr
