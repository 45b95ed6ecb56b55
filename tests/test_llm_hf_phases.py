"""``quantscope phases``: a real Hugging Face causal-LM export -> the prefill/decode pair.

The export is ``transformers.LlamaForCausalLM`` (2 layers, GQA 4/2, random weights and
norm gains) exported by ``torch.onnx.export`` with its cache as inputs and outputs, as a
user exports Qwen or Llama: ``input_ids``, ``attention_mask``, ``position_ids``,
``past_key_values.{i}.key|value`` -> ``logits``, ``present.{i}.key|value``, its RMSNorms
spelt out in Pow/ReduceMean/Sqrt/Div/Mul. Before, quantscope refused it ("re-export in
this form"); now it converts it and measures it as it measures the built-in decoder.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from decoder_tiny import byte_tokenizer
from hf_causal_lm import export_with_cache
from test_llm_user_export import hf_decoder

from quantscope.cli import main
from quantscope.zoo.prefix import KVPrefix, prefixed_prefill

LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 8


def _export(path: Path, vocab: int) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=KV_HEADS, max_position_embeddings=512,
        rope_theta=100.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # gains that are not all one
                p.copy_(1 + 0.2 * torch.randn_like(p))

    export_with_cache(model, path, layers=LAYERS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                      vocab=vocab)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hf")
    vocab = byte_tokenizer(folder / "tokenizer.json")
    _export(folder / "model.onnx", vocab)
    return folder / "model.onnx"


@pytest.fixture(scope="module")
def converted(export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    before = _digest(export)
    out = tmp_path_factory.mktemp("phases") / "qwen"
    assert main(["phases", str(export), "--out", str(out)]) == 0
    assert _digest(export) == before  # the export is only read
    return out


def _session(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def _export_feeds(ids: np.ndarray) -> dict[str, np.ndarray]:
    n = ids.shape[1]
    empty = np.zeros((1, KV_HEADS, 0, HEAD_DIM), np.float32)
    return {"input_ids": ids, "attention_mask": np.ones((1, n), np.int64),
            "position_ids": np.arange(n, dtype=np.int64)[None],
            **{f"past_key_values.{i}.{k}": empty for i in range(LAYERS)
               for k in ("key", "value")}}


def test_the_phase_graphs_compute_what_the_export_computes(export: Path, converted: Path
                                                           ) -> None:
    files = sorted(p.name for p in converted.iterdir())
    assert files == ["model.decode.onnx", "model.prefill.onnx", "model.tokenizer.json"]
    ref, pre, dec = (_session(p) for p in (export, converted / "model.prefill.onnx",
                                           converted / "model.decode.onnx"))
    assert [(i.name, i.shape[0]) for i in pre.get_inputs()] == [("input_ids", 1)]
    ids = np.random.default_rng(1).integers(0, 256, (1, 9)).astype(np.int64)
    want = ref.run(None, _export_feeds(ids))
    got = pre.run(None, {"input_ids": ids})
    for w, g in zip(want, got, strict=True):  # logits and every present.*
        np.testing.assert_allclose(g, w, atol=1e-5)
    # decode: the next token against prefill's cache == the export on the whole sequence
    nxt = np.array([[42]], np.int64)
    past = {f"past.{i}.{k}": got[1 + 2 * i + (k == "value")] for i in range(LAYERS)
            for k in ("key", "value")}
    step = dec.run(None, {"input_ids": nxt, **past})
    whole = ref.run(None, _export_feeds(np.concatenate([ids, nxt], 1)))
    np.testing.assert_allclose(step[0][0, -1], whole[0][0, -1], atol=1e-4)
    for s, w in zip(step[1:], whole[1:], strict=True):
        np.testing.assert_allclose(s, w, atol=1e-5)


def test_norms_are_fused_casts_dropped_and_names_kept(export: Path, converted: Path) -> None:
    original = {n.name for n in onnx.load(str(export)).graph.node}
    phases = {p: onnx.load(str(converted / f"model.{p}.onnx")) for p in ("prefill", "decode")}
    for proto in phases.values():
        ops = Counter(n.op_type for n in proto.graph.node)
        assert ops["RMSNormalization"] == 2 * LAYERS + 1, ops
        assert ops["ReduceMean"] == 0 and ops["Sqrt"] == 0, ops
        assert proto.opset_import[0].version == 23
        names = {n.name for n in proto.graph.node}
        norms = {n.name for n in proto.graph.node if n.op_type == "RMSNormalization"}
        assert "/m/model/layers.0/input_layernorm" in norms, norms
        # every node is the export's, a fused norm, or the mask/position plumbing (qs.*)
        assert names - original - norms <= {n for n in names if n.startswith("qs.")}
    from quantscope.model.groups import find_groups
    from quantscope.model.load import load

    groups = find_groups(load(converted / "model.prefill.onnx")).groups
    assert not [g.name for g in groups if g.op_type == "Cast"]
    assert {n.name for n in phases["prefill"].graph.node} == \
        {n.name for n in phases["decode"].graph.node}  # one plan names both phases


def test_a_kv_prefix_continues_the_converted_prefill(converted: Path) -> None:
    proto = onnx.load(str(converted / "model.prefill.onnx"))
    plain = _session(proto)
    tokens = np.array([[10, 200]], np.int64)
    present = plain.run(None, {"input_ids": tokens})[1:]
    prefix = KVPrefix((10, 200), tuple(present[0::2]), tuple(present[1::2]))
    prefixed = _session(prefixed_prefill(proto, prefix))
    ids = np.random.default_rng(2).integers(0, 256, (1, 7)).astype(np.int64)
    got = prefixed.run(None, {"input_ids": ids})
    whole = plain.run(None, {"input_ids": np.concatenate([tokens, ids], 1)})
    np.testing.assert_allclose(got[0], whole[0][:, 2:], atol=1e-4)
    for g, w in zip(got[1:], whole[1:], strict=True):  # the cache begins with the prefix
        np.testing.assert_allclose(g, w, atol=1e-5)


def test_what_cannot_be_converted_is_one_line(export: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    no_cache = tmp_path / "nocache.onnx"
    onnx.save(hf_decoder(False), str(no_cache))
    extra = hf_decoder(True)
    extra.graph.input.append(onnx.helper.make_tensor_value_info(
        "token_type_ids", onnx.TensorProto.INT64, ["B", "S"]))
    onnx.save(extra, str(tmp_path / "extra.onnx"))
    cases = [(["phases", str(no_cache), "--out", str(tmp_path / "a")], "no decode phase"),
             (["phases", str(tmp_path / "extra.onnx"), "--out", str(tmp_path / "b")],
              "'token_type_ids'")]
    # an export named as a prefill graph, converted beside itself under its own name
    named = tmp_path / "x.prefill.onnx"
    named.write_bytes(export.read_bytes())
    cases.append((["phases", str(named), "--out", str(tmp_path), "--name", "x"],
                  "would overwrite an input file"))
    before = _digest(named)
    for args, said in cases:
        code = main(args)
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        assert said in err and "Traceback" not in err, err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert _digest(named) == before and not (tmp_path / "x.decode.onnx").exists()


@pytest.mark.slow
def test_run_measures_the_export_itself_as_a_decoder(export: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``run EXPORT.onnx`` converts the export into the run folder (as ``phases`` does) and
    measures the pair; a rerun on the same files reuses the pair and every stage."""
    out = tmp_path / "run"
    argv = ["run", str(export), "--data", "stdlib-docs", "--target", "hailo10h",
            "--seq-len", "32", "--lm-tokens", "200", "--prompts", "2", "--new-tokens", "8",
            "--decode-steps", "16", "--out", str(out)]
    before = _digest(export)
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "[phases] converting" in said and "RMSNorm(s)" in said, said
    assert _digest(export) == before  # the export is only read
    assert {p.name for p in (out / "phases").iterdir()} >= {
        "model.prefill.onnx", "model.decode.onnx", "model.tokenizer.json", "export.json"}
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["kind"] == "decoder"
    for metric in ("ppl_ratio", "top1_agreement", "decode_top1", "greedy_agreement"):
        assert 0 <= verdict["figures"][metric]["value"] <= (5 if metric == "ppl_ratio" else 1)
    plan = json.loads((out / "plan.json").read_text())
    assert any(g.startswith("/m/model/layers.") for g in plan["groups"]), plan["groups"]
    for phase in ("prefill", "decode"):
        assert (out / phase / "model.alls").is_file()
    assert main(argv) == 0  # resumed: nothing converted, nothing run
    said = capsys.readouterr().out
    assert "[phases] done already" in said and "stages run: none" in said, said


def test_run_on_an_export_refuses_before_writing(export: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """What a run on an export cannot do is one line before the run folder exists: an
    encoder's option, no tokenizer for the text it measures on."""
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "model.onnx").write_bytes(export.read_bytes())
    for extra in export.parent.glob("*.data"):
        (alone / extra.name).write_bytes(extra.read_bytes())
    cases = [(export, ["--pairs", "40"], "--pairs: not for a decoder LLM's run"),
             (alone / "model.onnx", [], "no tokenizer.json beside it: give --tokenizer")]
    for model, extra, said in cases:
        out = tmp_path / "run"
        code = main(["run", str(model), "--data", "stdlib-docs", "--target", "hailo10h",
                     "--out", str(out), *extra])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and said in err, err
        assert not out.exists()


def test_gatedsplit_splits_the_converted_prefill(converted: Path) -> None:
    """The converted graphs are one sequence (batch 1): the function check of a rewrite
    feeds a batch of the input's size, where a symbolic batch was fed 2 sequences against
    a mask made for one (ONNX Runtime: Gather index out of bounds in the mask's lookup)."""
    from quantscope.model.load import load
    from quantscope.repair.gated import phase_maker

    make = phase_maker(lambda p: load(converted / f"model.{p}.onnx"), 32, chunk=8)
    proto, what = make("prefill")
    assert "split along the tokens" in what and "FP32 max relative diff" in what, what
    assert sum(n.op_type == "Slice" for n in proto.graph.node) >= 4
