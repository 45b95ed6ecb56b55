"""A tiny Llama-style decoder (2 layers, GQA 4/2, RMSNorm, KV cache) built in the tests."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np

from quantscope.zoo.decoder import DecoderConfig, weight_names

TINY = DecoderConfig(layers=2, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=61, rope_theta=100.0)


def tiny_weights(cfg: DecoderConfig = TINY, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights with the shapes of :func:`weight_names` (norm gains near 1)."""
    rng = np.random.default_rng(seed)
    h, kv = cfg.hidden, cfg.kv_heads * cfg.head_dim
    shapes = {"q_proj": (h, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, h),
              "gate_proj": (cfg.ffn, h), "up_proj": (cfg.ffn, h), "down_proj": (h, cfg.ffn)}
    out: dict[str, np.ndarray] = {}
    for name in weight_names(cfg):
        part = name.split(".")[-2]
        if part.endswith("norm") or name == "norm.weight":
            out[name] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
        elif name in ("embed.weight", "lm_head.weight"):
            out[name] = rng.standard_normal((cfg.vocab, h)).astype(np.float32)
        else:
            shape = shapes[part]
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    return out


def byte_tokenizer(path: Path) -> int:
    """A byte-level BPE tokenizer with no merges (256 tokens) written to ``path``: its size."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = tokenizers.Tokenizer(models.BPE({c: i for i, c in enumerate(sorted(alphabet))}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    path.write_text(tok.to_str())
    return len(alphabet)


def byte_decoder(folder: Path, cfg: DecoderConfig = TINY, *, seed: int = 0,
                 weights: dict[str, np.ndarray] | None = None) -> Path:
    """The tiny decoder over a byte-level BPE vocabulary (256 tokens), as the files a
    built-in decoder has: ``byte.prefill.onnx``, ``byte.decode.onnx``,
    ``byte.tokenizer.json``. Returns the prefill file."""
    import dataclasses

    import onnx

    from quantscope.zoo.decoder import build_decoder

    cfg = dataclasses.replace(cfg, vocab=byte_tokenizer(folder / "byte.tokenizer.json"))
    w = weights or tiny_weights(cfg, seed)
    for p in ("prefill", "decode"):
        onnx.save(build_decoder(cfg, w, p), str(folder / f"byte.{p}.onnx"))
    return folder / "byte.prefill.onnx"


def run_cli(args: list[str]) -> tuple[int, str]:
    """``quantscope ARGS`` in this process: its exit code and what it printed."""
    from quantscope.cli import main

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        code = main(args)
    return code, text.getvalue()


# the tiny decoder's prompt length and small amounts of text for plan / check / run tests
SEQ = 32
AMOUNTS = ["--lm-tokens", "300", "--prompts", "4", "--new-tokens", "16", "--decode-steps", "32"]


def searched_run(folder: Path) -> tuple[Path, str, list[str]]:
    """``run <decoder> --rewrites search`` (four plan searches: the test modules that read
    one share it, conftest.searched_decoder) in ``folder/run`` (with a goal, the ``w4`` stage
    and ``--whatif``, so the report has every section): its folder, what it printed and its
    arguments."""
    model = byte_decoder(folder)
    out = folder / "run"
    args = ["run", str(model), "--data", "stdlib-docs", "--target", "hailo10h", "--goal",
            "1.5", "--seq-len", str(SEQ), "--rewrites", "search", *AMOUNTS, "--whatif",
            "--out", str(out)]
    code, printed = run_cli(args)
    assert code == 0, printed
    return out, printed, args


def phase_graphs(cfg: DecoderConfig = TINY, seed: int = 0) -> dict:
    """The tiny decoder's prefill and decode graphs, loaded (``quantscope.model.load``)."""
    from quantscope.model.load import load_proto
    from quantscope.zoo.decoder import build_decoder

    w = tiny_weights(cfg, seed)
    return {p: load_proto(build_decoder(cfg, w, p), source=p) for p in ("prefill", "decode")}


def run_graph(proto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One ORT session over ``proto``: output name -> array."""
    from quantscope.emulate.session import make_session

    s = make_session(proto)
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds), strict=True))


def prefill_then_decode(graphs: dict, ids: np.ndarray, prompt: int = 5
                        ) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """Logits of a ``prompt``-token prefill of ``ids``, then of one decode step per token
    after it on its own cache; and the last step's outputs (its cache)."""
    out = run_graph(graphs["prefill"], {"input_ids": ids[None, :prompt]})
    logits = [out["logits"][0]]
    for t in range(prompt, len(ids)):
        past = {k.replace("present.", "past."): v for k, v in out.items() if k != "logits"}
        out = run_graph(graphs["decode"], {"input_ids": ids[None, t:t + 1], **past})
        logits.append(out["logits"][0])
    return logits, out
