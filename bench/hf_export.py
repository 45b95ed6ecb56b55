"""A real pretrained decoder exported the way a user exports one, through ``quantscope phases``.

SmolLM2-135M's weights (the built-in's GGUF, ``zoo.smollm.read_gguf``: HF names and layout)
are loaded into ``transformers.LlamaForCausalLM`` and exported with ``torch.onnx.export``
with its cache as inputs and outputs (``input_ids``, ``attention_mask``, ``position_ids``,
``past_key_values.*`` -> ``logits``, ``present.*``), as field report 004's user exports
Qwen. ``quantscope phases`` converts it; the converted prefill and decode graphs are then
compared in FP32 with the built-in ``smollm2-135m`` graphs (same weights, built by
``zoo/decoder.py``) on stdlib-docs windows: the largest logit difference and the top-1
agreement between the two. With ``--run FOLDER`` it then runs
``quantscope run <converted> --data stdlib-docs --target hailo10h`` at small amounts beside
the same run of the built-in, so the two verdicts can be compared.

    PYTHONPATH=src python bench/hf_export.py --out /tmp/hf [--run]

Needs torch and transformers (the ``models`` extra) and the built-in smollm2-135m.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def export(folder: Path) -> Path:
    import torch
    import transformers

    from quantscope.zoo.cache import cache_dir
    from quantscope.zoo.smollm import TOKENIZER_NAME, gguf_path, read_gguf

    cfg, weights, _ = read_gguf(gguf_path())
    hf = transformers.LlamaConfig(
        vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.ffn,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.eps,
        max_position_embeddings=8192, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(hf).eval()
    top = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
           "lm_head.weight": "lm_head.weight"}
    norms = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
    attn = ("q_proj", "k_proj", "v_proj", "o_proj")
    state = {}
    for name, w in weights.items():  # zoo names (layers.{i}.q_proj.weight) -> HF names
        key = top.get(name)
        if key is None:
            _, layer, part, kind = name.split(".")
            block = norms.get(part) or f"{'self_attn' if part in attn else 'mlp'}.{part}"
            key = f"model.layers.{layer}.{block}.{kind}"
        state[key] = torch.from_numpy(np.ascontiguousarray(w))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if [m for m in missing if "rotary" not in m] or unexpected:
        raise SystemExit(f"weights do not map: missing {missing}, unexpected {unexpected}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "smollm2-hf.onnx"
    t = time.perf_counter()
    sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
    from hf_causal_lm import export_with_cache  # the exporter the tests use

    export_with_cache(model, path, layers=cfg.layers, kv_heads=cfg.kv_heads,
                      head_dim=cfg.head_dim, vocab=cfg.vocab)
    shutil.copy(cache_dir() / TOKENIZER_NAME, folder / "tokenizer.json")
    print(f"exported {path} in {time.perf_counter() - t:.1f} s")
    return path


def compare(converted: Path, windows: int) -> None:
    import onnxruntime as ort

    from quantscope.tasks.lm import load_lm_tokenizer, token_windows
    from quantscope.zoo import resolve_model

    builtin = Path(resolve_model("smollm2-135m"))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ours = {p: ort.InferenceSession(str(converted.with_name(converted.name.replace(
        ".prefill.", f".{p}."))), so) for p in ("prefill", "decode")}
    ref = {p: ort.InferenceSession(str(builtin.with_name(builtin.name.replace(
        ".prefill.", f".{p}."))), so) for p in ("prefill", "decode")}
    win = token_windows(load_lm_tokenizer(builtin), seq_len=64, evaluation=windows)
    worst, agree, n, worst_dec, agree_dec = 0.0, 0, 0, 0.0, 0
    for ids in win.evaluation:
        a = ours["prefill"].run(None, {"input_ids": ids[None, :-1]})
        b = ref["prefill"].run(None, {"input_ids": ids[None, :-1]})
        worst = max(worst, float(np.abs(a[0] - b[0]).max()))
        agree += int((a[0][0].argmax(-1) == b[0][0].argmax(-1)).sum())
        n += a[0].shape[1]
        past_a = {f"past.{i // 2}.{'key' if i % 2 == 0 else 'value'}": t
                  for i, t in enumerate(a[1:])}
        past_b = {f"past.{i // 2}.{'key' if i % 2 == 0 else 'value'}": t
                  for i, t in enumerate(b[1:])}
        da = ours["decode"].run(None, {"input_ids": ids[None, -1:], **past_a})[0]
        db = ref["decode"].run(None, {"input_ids": ids[None, -1:], **past_b})[0]
        worst_dec = max(worst_dec, float(np.abs(da - db).max()))
        agree_dec += int(da[0, -1].argmax() == db[0, -1].argmax())
    print(f"FP32, {len(win.evaluation)} windows of 63 + 1 tokens: prefill largest logit "
          f"difference {worst:.2e}, top-1 agreement {agree / n:.4f} ({n} positions); decode "
          f"largest difference {worst_dec:.2e}, top-1 agreement "
          f"{agree_dec / len(win.evaluation):.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--run", action="store_true", help="also run both at small amounts")
    args = ap.parse_args()
    path = export(args.out)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "quantscope", "phases", str(path), "--out",
                    str(args.out / "phases")], check=True)
    print(f"converted in {time.perf_counter() - t:.1f} s")
    converted = args.out / "phases" / "smollm2-hf.prefill.onnx"
    compare(converted, args.windows)
    if args.run:
        small = ["--data", "stdlib-docs", "--target", "hailo10h", "--lm-tokens", "2000",
                 "--prompts", "8", "--new-tokens", "32", "--decode-steps", "64"]
        for label, model in (("converted", str(converted)), ("built-in", "smollm2-135m")):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "quantscope", "run", model, *small,
                            "--out", str(args.out / f"run-{label}")], check=True)
            print(f"run {label}: {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
