"""A constant KV prefix on the tiny decoder: FP32-identical logits in both phases, the
sink tokens found from calibration, and the prefix through plan / check --phase."""

from __future__ import annotations

import numpy as np
import pytest
from decoder_tiny import AMOUNTS, SEQ, TINY, tiny_weights

from quantscope.analyze.prefix import (
    after_text,
    choose_prefix,
    compute_prefix,
    format_prefix,
    prefix_words,
    prefixed_model,
    scan_after,
    scan_sinks,
)
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.tasks.lm_phases import cache_of, runner
from quantscope.types import QuantscopeError
from quantscope.zoo.decoder import build_decoder
from quantscope.zoo.prefix import KVPrefix, prefixed_prefill, read_prefix

PREFIX = (7, 3)
IDS = np.array([11, 5, 2, 9, 40, 17, 23, 30], np.int64)
SINK, CHANNEL, MASSIVE = 7, 5, 400.0


@pytest.fixture(scope="module")
def models() -> dict:
    w = tiny_weights()
    return {p: load_proto(build_decoder(TINY, w, p), source=f"tiny.{p}")
            for p in ("prefill", "decode")}


def test_prefixed_prefill_equals_the_original_on_the_whole_prompt(models) -> None:
    prefix = compute_prefix(models["prefill"], PREFIX)
    assert len(prefix) == 2 and prefix.keys[0].shape == (1, TINY.kv_heads, 2, TINY.head_dim)
    whole = runner(models["prefill"])({"input_ids": np.array([[*PREFIX, *IDS]])})
    pre = prefixed_model(models["prefill"], prefix)
    out = runner(pre)({"input_ids": IDS[None]})
    p = len(PREFIX)
    np.testing.assert_allclose(out["logits"][0], whole["logits"][0, p:], atol=1e-4)
    for name in ("present.0.key", "present.1.value"):  # prefix first, then the prompt
        assert out[name].shape[2] == p + len(IDS)
        np.testing.assert_allclose(out[name], whole[name], atol=1e-5)
    # the prefix is constant in the graph: no new input, and the groups are the same
    assert [i.name for i in pre.proto.graph.input] == ["input_ids"]
    assert find_groups(pre).names() == find_groups(models["prefill"]).names()


def test_decode_after_a_prefixed_prefill_equals_the_original(models) -> None:
    """Prefill 3 prompt tokens after the prefix, then decode the rest against the cache
    (prefix included); and decode fed the prefix alone as its past, token by token."""
    prefix = compute_prefix(models["prefill"], PREFIX)
    full = runner(models["prefill"])({"input_ids": np.array([[*PREFIX, *IDS]])})["logits"][0]
    p, decode = len(PREFIX), runner(models["decode"])
    out = runner(prefixed_model(models["prefill"], prefix))({"input_ids": IDS[None, :3]})
    for t in range(3, len(IDS)):
        out = decode({"input_ids": IDS[None, t:t + 1], **cache_of(out)})
        np.testing.assert_allclose(out["logits"][0, 0], full[p + t], atol=1e-4)
    cache = prefix.cache()  # what the host loads into the cache
    for t in range(len(IDS)):
        out = decode({"input_ids": IDS[None, t:t + 1], **cache})
        cache = cache_of(out)
        np.testing.assert_allclose(out["logits"][0, 0], full[p + t], atol=1e-4)


def test_prefix_file_round_trip_and_wrong_graph(models, tmp_path) -> None:
    prefix = compute_prefix(models["prefill"], PREFIX)
    path = tmp_path / "p.npz"
    path.write_bytes(prefix.to_bytes())
    back = read_prefix(path)
    assert back.tokens == PREFIX
    np.testing.assert_array_equal(back.values[1], prefix.values[1])
    with pytest.raises(QuantscopeError, match="decoder form"):
        prefixed_prefill(models["decode"].proto, prefix)  # decode: Concat(past, k)
    short = KVPrefix(PREFIX, prefix.keys[:1], prefix.values[:1])
    with pytest.raises(QuantscopeError, match="2 layers|1 layers"):
        prefixed_prefill(models["prefill"].proto, short)
    bad = tmp_path / "bad.npz"
    bad.write_text("no")
    with pytest.raises(QuantscopeError, match="not a KV prefix"):
        read_prefix(bad)


def _sink_model() -> tuple:
    """The tiny prefill graph with token 7 massive in channel 5 (its embedding), and four
    windows with token 7 at positions 3, 4, 5, 6."""
    w = tiny_weights()
    w["embed.weight"] = w["embed.weight"].copy()
    w["embed.weight"][SINK, CHANNEL] = MASSIVE
    pre = load_proto(build_decoder(TINY, w, "prefill"), source="tiny.prefill")
    rng = np.random.default_rng(3)
    windows = [rng.integers(8, TINY.vocab, 16) for _ in range(4)]
    for k, win in enumerate(windows):
        win[3 + k] = SINK
    return pre, windows


def test_sink_tokens_found_from_calibration() -> None:
    """Token 7 carries a massive activation wherever it sits: it is named an outlier
    (twice or more at positions > 0) and joins the first position's token."""
    pre, windows = _sink_model()
    scan = scan_sinks(pre, windows)
    assert scan.outliers()[SINK] == 4 and set(scan.outliers()) == {SINK}
    choice = choose_prefix(scan, first=0)
    assert choice.tokens == (0, SINK)
    assert "document token" in choice.why[0] and "4 times" in choice.why[1]
    assert choice.later_ratio > 64
    assert choose_prefix(scan, first=None).tokens == (SINK,)  # the outlier comes first
    # per position, the largest ratio over the windows (what the report plots)
    assert len(choice.profile) == 16
    assert max(choice.profile[1:]) == pytest.approx(choice.later_ratio)
    assert choice.profile == tuple(float(x) for x in np.max(np.stack(scan.ratios), axis=0))
    # after the prefix the sink token's later occurrences are what is left to measure
    prefixed = prefixed_model(pre, compute_prefix(pre, choice.tokens))
    assert scan_sinks(prefixed, windows).ratios[0].shape == (16,)


def test_what_is_left_after_the_prefix_is_found_and_said() -> None:
    """With only token 0 in the prefix, the massive token 7 is still in every window: the
    scan on the prefixed graph names it, its window position and the windows, and the
    probe finds it (and only it) an outlier as the first token after the prefix; the
    record reads back in words. On windows without token 7 nothing is left, and that is
    said too."""
    pre, windows = _sink_model()
    after = scan_after(prefixed_model(pre, compute_prefix(pre, (0,))), windows)
    assert (after.windows, after.over, after.worst_token) == (4, 4, SINK)
    assert after.worst_position in {3, 4, 5, 6}  # where token 7 sits in the worst window
    assert after.worst_ratio > 64
    assert [t for t, _ in after.first_sinks] == [SINK]
    assert max(after.profile) == pytest.approx(after.worst_ratio)
    assert after.probed == len({int(t) for win in windows for t in win})
    record = {"tokens": [0], "text": ["<d>"], "why": ["first position"], "threshold": 64.0,
              "first_position_ratio": float("nan"), "largest_later_ratio": float("nan"),
              "after": {**after.__dict__, "worst_text": "<s>",
                        "first_sinks": [[t, "<s>", r] for t, r in after.first_sinks]}}
    said = after_text(record)
    assert said.startswith("after it, 4 of 4 calibration window(s) still have an outlier")
    assert "'<s>' at position" in said and "of its window" in said and "1 of the" in said and said in format_prefix(record)
    # each run of tokens with one reason is one string, said with its reason once; the
    # tokenizer's decoding where recorded, else the vocabulary's spelling
    head = {"tokens": [0, 1, 2], "text": ["<d>", "Ġa", "Ċ"], "decoded": ["<d>", " a", "\n"],
            "why": ["first", "the head", "the head"]}
    assert prefix_words(head) == "'<d>' (first), ' a\\n' (the head)"
    assert prefix_words({**head, "decoded": None}) == "'<d>' (first), 'ĠaĊ' (the head)"
    quiet = scan_after(prefixed_model(pre, compute_prefix(pre, (0,))),
                       [win[win != SINK] for win in windows])
    assert quiet.over == 0 and not quiet.first_sinks
    assert "no calibration window has an outlier position" in after_text(
        {**record, "after": {**quiet.__dict__, "worst_text": "x", "first_sinks": []}})


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> tuple:
    import contextlib
    import io

    from decoder_tiny import byte_decoder

    from quantscope.cli import main

    folder = tmp_path_factory.mktemp("prefixplan")
    model = byte_decoder(folder)
    out = folder / "plan.json"
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        code = main(["plan", str(model), "--target", "hailo10h", "--phase", "prefill,decode",
                     "--max-cost", "1.5", "--seq-len", str(SEQ), "--prefix", "auto", *AMOUNTS,
                     "--out", str(out)])
    assert code == 0
    return model, out, text.getvalue()


@pytest.mark.slow
def test_plan_records_the_prefix_and_check_measures_with_it(planned, capsys) -> None:
    import json

    from quantscope.cli import main
    from quantscope.export.kv_prefix import plan_alls_note
    from quantscope.serde import read_plan
    from quantscope.stages_llm import LmSetup, lm_quality, recorded_prefix
    from quantscope.tasks.lm_phases import LM_PHASES

    model, out, text = planned
    plan = read_plan(out)
    rec = json.loads(dict(plan.meta)["kv_prefix"])
    assert read_prefix(out.with_suffix(".prefix.npz")).tokens == tuple(rec["tokens"])
    assert recorded_prefix(plan) == tuple(rec["tokens"]) and len(rec["why"]) == len(rec["tokens"])
    assert "KV prefix: 1 token(s) in FP32 in the cache" in text
    assert f"slots 0..{len(rec['tokens']) - 1}" in plan_alls_note(plan)
    setup = LmSetup.at(SEQ, tokens=300, prompts=4, new_tokens=16, decode_steps=32)
    recorded = json.loads(dict(plan.meta)["phase_results"])["quality"]
    fresh = lm_quality(model, {"p": plan}, setup, recorded_prefix(plan))["plans"]["p"]
    for phase in (*LM_PHASES, "greedy"):
        for key, value in recorded[phase].items():
            assert fresh[phase][key] == pytest.approx(value, rel=1e-6, abs=1e-9), (phase, key)
    without = lm_quality(model, {"p": plan}, setup, "none")["plans"]["p"]
    assert without["prefill"]["ppl_fp32"] != pytest.approx(fresh["prefill"]["ppl_fp32"])
    # check --phase --quality measures with the plan's prefix by default
    assert main(["check", str(out), "--model", str(model), "--target", "hailo10h", "--phase",
                 "prefill,decode", "--seq-len", str(SEQ), "--quality", *AMOUNTS]) == 0
    printed = capsys.readouterr().out
    assert "KV prefix: 1 token(s)" in printed and "recorded in the plan" in printed
    v = recorded["prefill"]
    assert (f"plan           prefill          {100 * v['top1_agreement']:>5.1f} % {v['kl']:>9.4f} "
            f"{v['ppl_ratio']:>10.4f}") in printed


@pytest.mark.slow
def test_host_snippet_generates_fp32_tokens_from_the_prefix(planned) -> None:
    """The snippet written beside the plan, run with the FP32 decode graph: the greedy
    tokens of the original graph on prefix + prompt."""
    from quantscope.stages_llm import open_phase
    from quantscope.tasks.lm_phases import generate

    model, out, _ = planned
    snippet = out.with_suffix(".prefix.py")
    scope: dict = {"__file__": str(snippet)}
    exec(compile(snippet.read_text(), str(snippet), "exec"), scope)
    tokens = read_prefix(out.with_suffix(".prefix.npz")).tokens
    prompt = np.array([72, 101, 108, 108, 111], np.int64)
    decode = runner(open_phase(model, "decode"))
    got = scope["generate"](decode, prompt, 6)
    pre = runner(open_phase(model, "prefill"))
    want = generate(pre, decode, np.array([*tokens, *prompt], np.int64), 6)
    assert got == want


def test_prefix_text_keeps_a_character_whose_bytes_span_tokens() -> None:
    """A byte-level tokenizer splits 'é' into two tokens; each decoded alone is '\ufffd'. The
    recorded texts give the character to the token that completes it, so the prefix's
    words spell 'café', not 'caf\ufffd\ufffd' (stop 67's leftover)."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    from quantscope.tasks.lm import token_texts

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = tokenizers.Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    ids = [len(alphabet), *tok.encode("café\n", add_special_tokens=False).ids]
    assert "\ufffd" in "".join(tok.decode([t]) for t in ids)  # the defect's cause
    texts = token_texts(tok, ids)
    assert len(texts) == len(ids) and "".join(texts) == "<|endoftext|>café\n"
    record = {"tokens": ids, "text": ["?"] * len(ids), "decoded": list(texts),
              "why": ["first"] + ["the head"] * (len(ids) - 1)}
    assert prefix_words(record) == "'<|endoftext|>' (first), 'café\\n' (the head)"
