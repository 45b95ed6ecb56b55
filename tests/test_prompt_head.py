"""``--prompt-head``: the text every prompt of a deployment begins with goes into the
constant KV prefix after the document token, in FP32 (docs/benchmarks.md, "A longer KV
prefix that leaves no sink": tokens quantscope adds to every prompt move FP32 itself; a
head the application sends anyway does not). The tiny byte-level decoder, real ORT."""

from __future__ import annotations

import json

import numpy as np
import pytest
from decoder_tiny import AMOUNTS, SEQ, byte_decoder, run_cli

from quantscope.analyze.prefix import HEAD, HEAD_MAX_TOKENS, head_choice, with_head
from quantscope.types import QuantscopeError

HEAD_TEXT = "Docs: "


def test_the_head_folds_into_the_prefix_and_bad_heads_are_refused() -> None:
    assert with_head("auto", None) == "auto" and with_head("none", None) == "none"
    assert with_head("auto", HEAD_TEXT) == HEAD + HEAD_TEXT
    assert with_head("plan", HEAD_TEXT) == HEAD + HEAD_TEXT  # check --phase: the head wins
    with pytest.raises(QuantscopeError, match="drop --prefix none"):
        with_head("none", HEAD_TEXT)
    with pytest.raises(QuantscopeError, match="--prompt-head is empty"):
        with_head("auto", "  \n")
    choice = head_choice(0, [5, 6, 7])
    assert choice.tokens == (0, 5, 6, 7) and "document token" in choice.why[0]
    assert all("prompt head" in w for w in choice.why[1:])
    assert head_choice(None, [5]).tokens == (5,)
    with pytest.raises(QuantscopeError, match=f"at most {HEAD_MAX_TOKENS}"):
        head_choice(0, list(range(HEAD_MAX_TOKENS + 1)))


def test_prompt_head_without_a_decoder_phase_is_refused(tmp_path, capsys) -> None:
    from quantscope.cli import main

    model = str(byte_decoder(tmp_path))
    plan = tmp_path / "p.json"
    plan.write_text("{}")
    for argv in (["plan", model, "--target", "hailo10h", "--out", str(tmp_path / "o.json"),
                  "--prompt-head", "x"],
                 ["check", str(plan), "--model", model, "--target", "hailo10h",
                  "--prompt-head", "x"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--prompt-head" in err and "--phase" in err


@pytest.mark.slow
def test_a_planned_head_is_the_prefix_and_fp32_reads_it_too(tmp_path) -> None:
    """plan --phase --prompt-head: the plan records the head's tokens as the prefix (one
    reason said once), the FP32 prefill with that prefix equals the FP32 prefill of the head
    and the prompt together, and check --phase --quality measures with it."""
    from quantscope.serde import read_plan
    from quantscope.stages_llm import load_lm_tokenizer, open_phase, recorded_prefix
    from quantscope.tasks.lm_phases import runner
    from quantscope.zoo.prefix import read_prefix

    model = byte_decoder(tmp_path)
    out = tmp_path / "plan.json"
    code, text = run_cli(["plan", str(model), "--target", "hailo10h", "--phase",
                          "prefill,decode", "--max-cost", "1.5", "--seq-len", str(SEQ),
                          "--prefix", "auto", "--prompt-head", HEAD_TEXT, *AMOUNTS,
                          "--out", str(out)])
    assert code == 0, text
    tok = load_lm_tokenizer(model)
    ids = tok.encode(HEAD_TEXT, add_special_tokens=False).ids
    plan = read_plan(out)
    tokens = recorded_prefix(plan)
    assert tokens[len(tokens) - len(ids):] == tuple(ids) and len(tokens) - len(ids) <= 1
    rec = json.loads(dict(plan.meta)["kv_prefix"])
    assert sum("prompt head" in w for w in rec["why"]) == len(ids)
    line = next(ln for ln in text.splitlines() if ln.startswith("KV prefix:"))
    assert line.count("prompt head") == 1, line
    assert read_prefix(out.with_suffix(".prefix.npz")).tokens == tokens
    # FP32 reads the head too: the prefixed prefill's logits are the whole sequence's
    from quantscope.analyze.prefix import prefixed_model

    prompt = np.array([72, 101, 108, 108, 111], np.int64)
    pre = open_phase(model, "prefill")
    whole = runner(pre)({"input_ids": np.array([[*tokens, *prompt]], np.int64)})["logits"][0]
    prefixed = prefixed_model(open_phase(model, "prefill"), read_prefix(
        out.with_suffix(".prefix.npz")))
    after = runner(prefixed)({"input_ids": prompt[None]})["logits"][0]
    np.testing.assert_allclose(after, whole[len(tokens):], atol=1e-4)
    code, text = run_cli(["check", str(out), "--model", str(model), "--target", "hailo10h",
                          "--phase", "prefill,decode", "--seq-len", str(SEQ), "--quality",
                          *AMOUNTS])
    assert code == 0 and f"KV prefix: {len(tokens)} token(s)" in text, text


@pytest.mark.slow
def test_a_decoder_run_takes_the_head_and_the_host_steps_say_it_once(tmp_path) -> None:
    """run --prompt-head on the tiny decoder: the verdict's prefix line holds the head, the
    host steps give its reason once; a rerun with another head plans again."""
    model = byte_decoder(tmp_path)
    out = tmp_path / "run"
    args = ["run", str(model), "--data", "stdlib-docs", "--target", "hailo10h", "--goal", "1.5",
            "--seq-len", str(SEQ), *AMOUNTS, "--prompt-head", HEAD_TEXT, "--out", str(out)]
    code, printed = run_cli(args)
    assert code == 0, printed
    host = (out / "host.md").read_text()
    assert host.count("prompt head (--prompt-head)") == 1, host
    # the head is said as its text, once, with its reason (not token by token, nor in the
    # vocabulary's spelling)
    said = f"{HEAD_TEXT!r} (the prompt head (--prompt-head)"
    assert said in host and said in (out / "verdict.txt").read_text()
    tokens = json.loads((out / "verdict.json").read_text())["prefix"]["tokens"]
    ids = json.loads((out / "host.json").read_text())["prefix"]["tokens"]
    assert tokens == ids and len(ids) >= len(HEAD_TEXT.encode())
    code, printed = run_cli([*args[:-4], "--prompt-head", "Other: ", "--out", str(out)])
    ran = next(ln for ln in printed.splitlines() if ln.startswith("stages run:"))
    assert code == 0 and "plan" in ran.split(";")[0], ran
    assert json.loads((out / "verdict.json").read_text())["prefix"]["tokens"] != tokens
