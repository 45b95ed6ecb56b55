"""An encoder quantscope has never seen, built in the test: a RoBERTa/XLM-R-style graph
(inputs ``input_ids`` and ``attention_mask`` only, no ``token_type_ids``; a word-embedding
table of more rows than any host-lookup threshold; output ``last_hidden_state`` [B,S,H] to
be mean pooled), its own word-level ``tokenizer.json`` (``<s> … </s>``, ``<pad>`` = 1) and
retrieval pairs in its vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

H, F = 16, 32
ROWS = 1500  # >= the targets' [host_embedding] rows (1,000): the lookup stays on the host
SPECIAL = ("<s>", "<pad>", "</s>", "<unk>")
PREFIX_WORDS = ("query", "passage", ":")
WORDS = tuple(f"w{i}" for i in range(400))


def unseen_encoder(seed: int = 0) -> onnx.ModelProto:
    """Embedding lookup, one pre-norm attention block with the additive mask, one GELU-less
    ReLU FFN, a final LayerNorm: ``last_hidden_state`` [B, S, 16]."""
    r = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []

    def w(name: str, shape: tuple[int, ...], s: float = 0.3) -> str:
        inits.append(numpy_helper.from_array(r.normal(0, s, shape).astype(np.float32), name))
        return name

    def const(name: str, value: object, dtype: object = np.float32) -> str:
        inits.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))
        return name

    for p in ("ln0", "ln1", "ln2"):
        inits.append(numpy_helper.from_array((1 + r.normal(0, 0.1, H)).astype(np.float32),
                                             f"{p}_g"))
        inits.append(numpy_helper.from_array(r.normal(0, 0.1, H).astype(np.float32), f"{p}_b"))
    n = helper.make_node
    nodes = [
        n("Gather", [w("roberta.embeddings.word_embeddings.weight", (ROWS, H), 1.0),
                     "input_ids"], ["emb"], name="embeddings/Gather"),
        n("LayerNormalization", ["emb", "ln0_g", "ln0_b"], ["x"], name="ln0", axis=-1),
        n("Cast", ["attention_mask"], ["mf"], name="mask/Cast", to=TensorProto.FLOAT),
        n("Unsqueeze", ["mf", const("ax1", [1], np.int64)], ["m3"], name="mask/Unsqueeze"),
        n("Sub", [const("one", 1.0), "m3"], ["inv"], name="mask/Sub"),
        n("Mul", ["inv", const("neg", -10000.0)], ["bias"], name="mask/Mul"),
        n("LayerNormalization", ["x", "ln1_g", "ln1_b"], ["n1"], name="ln1", axis=-1),
        n("MatMul", ["n1", w("wq", (H, H))], ["q"], name="q"),
        n("MatMul", ["n1", w("wk", (H, H))], ["k"], name="k"),
        n("MatMul", ["n1", w("wv", (H, H))], ["v"], name="v"),
        n("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["s"], name="scores"),
        n("Mul", ["s", const("scale", 0.25)], ["ss"], name="scale"),
        n("Add", ["ss", "bias"], ["sm"], name="mask/Add"),
        n("Softmax", ["sm"], ["a"], name="softmax", axis=-1),
        n("MatMul", ["a", "v"], ["c"], name="context"),
        n("MatMul", ["c", w("wo", (H, H))], ["o"], name="out_proj"),
        n("Add", ["x", "o"], ["h"], name="residual1"),
        n("LayerNormalization", ["h", "ln2_g", "ln2_b"], ["n2"], name="ln2", axis=-1),
        n("MatMul", ["n2", w("w1", (H, F))], ["u"], name="fc1"),
        n("Add", ["u", w("b1", (F,), 0.1)], ["ub"], name="fc1/bias"),
        n("Relu", ["ub"], ["g"], name="relu"),
        n("MatMul", ["g", w("w2", (F, H))], ["d"], name="fc2"),
        n("Add", ["h", "d"], ["last_hidden_state"], name="residual2"),
    ]
    ins = [helper.make_tensor_value_info(x, TensorProto.INT64, ["batch", "sequence"])
           for x in ("input_ids", "attention_mask")]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                        ["batch", "sequence", H])
    graph = helper.make_graph(nodes, "unseen", ins, [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8)


def vocabulary() -> dict[str, int]:
    """Token -> id: the special tokens, the prefix words, the text words (< ROWS)."""
    return {t: i for i, t in enumerate((*SPECIAL, *PREFIX_WORDS, *WORDS))}


def write_tokenizer(path: Path) -> Path:
    """A word-level ``tokenizer.json`` (whitespace and punctuation split, ``<s> $A </s>``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = vocabulary()
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])])
    tok.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>"])
    tok.save(str(path))
    return path


def write_pairs(path: Path, n: int = 64, seed: int = 1) -> Path:
    """``n`` query/document pairs: a document is 6-12 words, its query 3 of them."""
    r = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        doc = [str(x) for x in r.choice(WORDS, int(r.integers(6, 13)), replace=False)]
        query = [str(x) for x in r.choice(doc, 3, replace=False)]
        lines.append(json.dumps({"query": " ".join(query), "document": " ".join(doc)}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
