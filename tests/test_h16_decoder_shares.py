"""A decoder run's share figures (prefill/decode top-1, greedy agreement) in percent through
report.fmt, as the encoder verdict writes them: the verdict text, its whatif, search and a8_w4
lines, and the report's HTML tables; perplexity ratios stay ratios, verdict.json keeps 0-1."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from quantscope.pipeline.decoder_report import (
    decoder_verdict,
    format_decoder_verdict,
    search_lines,
    whatif_summary,
)
from quantscope.report import fmt
from quantscope.report.decoder import decoder_report_html, search_section, whatif_section

SETUP = {"evaluation": 4, "seq_len": 32, "prompts": 2, "new_tokens": 8, "steps": 4,
         "decode_windows": 4}


def _quality(ppl: float, top1: float, dec: float, greedy: float) -> dict:
    return {"prefill": {"ppl_ratio": ppl, "ppl_ratio_se": 0.004, "top1_agreement": top1,
                        "top1_agreement_se": 0.0112, "kl": 0.01},
            "decode_emu_kv": {"ppl_ratio": ppl, "top1_agreement": dec,
                              "top1_agreement_se": 0.021, "kl": 0.02},
            "greedy": {"greedy_agreement": greedy, "greedy_agreement_se": 0.05}}


def _figures(top1: float) -> dict:
    return {"ppl_ratio": {"value": 1.0321, "se": 0.004},
            "top1_agreement": {"value": top1, "se": 0.0112},
            "decode_top1": {"value": 0.9012, "se": 0.021}}


@pytest.fixture
def verdict() -> dict:
    opts = SimpleNamespace(model="tiny.onnx", target="hailo10h", metric="top1_agreement",
                           goal=0.9, max_cost=1.5)
    checks = {"prefill": {"cost": 1.2, "errors": 0}, "decode": {"cost": 1.1, "errors": 0}}
    plan_doc = {"default": "a8_w8", "groups": {}, "meta": {
        "phase_results": json.dumps({"checks": checks}), "candidate": "c1",
        "lm_setup": json.dumps(SETUP)}}
    evaluation = {"plans": {"plan": _quality(1.0321, 0.9312, 0.9012, 0.75)},
                  "data": "stdlib-docs", "setup": SETUP}
    w4 = {"asked": True, "layers": 3, "measured": True, "quality": _quality(1.05, 0.884, 0.87, 0.5),
          "gptq": {"effect": "x"},
          "checks": {"w4.prefill": {"cost": 1.0, "weight_mb": 1.0, "rules": []},
                     "w4.decode": {"cost": 0.9, "weight_mb": 0.5, "rules": []},
                     "w8.decode": {"cost": 1.1, "weight_mb": 1.0, "rules": []}}}
    v = decoder_verdict(opts, plan_doc, evaluation, {"rewrites": []}, w4)
    rows = [{"label": "plan", "what": "the plan", "figures": _figures(0.9312),
             "costs": {"prefill": 1.2, "decode": 1.1}, "ships": True, "rules": [],
             "changed": {}},
            {"label": "as-scripted", "what": "as scripted", "figures": _figures(0.8876),
             "costs": {"prefill": 1.2, "decode": 1.1}, "ships": True, "rules": [],
             "changed": {"prefill": 2}}]
    v["whatif"] = whatif_summary({"asked": True, "variants": rows, "setup": SETUP,
                                  "max_cost": 1.5}, opts)
    return v


def test_decoder_verdict_writes_shares_in_percent(verdict) -> None:
    assert verdict["figures"]["top1_agreement"]["value"] == 0.9312  # the JSON keeps 0-1
    text = format_decoder_verdict(verdict)
    lines = {ln.split()[0]: ln for ln in text.splitlines() if ln.startswith("    ")}
    assert "93.1 % (± 1.1 pts)" in lines["top1_agreement"], text
    assert "90.1 % (± 2.1 pts)" in lines["decode_top1"], text
    assert "75.0 % (± 5.0 pts)" in lines["greedy_agreement"], text
    assert "  1.0321 (± 0.0040)" in lines["ppl_ratio"], text  # a ratio stays a ratio
    assert ("goal: reached: top1_agreement 93.1 % (± 1.1 pts) against the goal 90.0 %"
            in text), text
    assert "top1_agreement 88.8 % ± 1.1 pts (plan 93.1 %)" in text  # as scripted
    assert "the goal as scripted: MISSED (top1_agreement 88.8 % ± 1.1 pts" in text
    assert "top1_agreement 93.1 % ± 1.1 pts  decode_top1 90.1 % ± 2.1 pts" in text  # whatif
    assert "goal top-1 agreement >= 90.0 %: reached by plan" in text
    assert "measured: ppl_ratio 1.0500 (± 0.0040), top1_agreement 88.4 % (± 1.1 pts)" in text
    assert not any(f"{x:.4f}" in text for x in (0.9312, 0.9012, 0.8876, 0.75, 0.884, 0.0112))


def test_decoder_search_and_html_tables_write_shares_in_percent(verdict) -> None:
    search = {"metric": "top1_agreement", "measured_by": "onnxruntime",
              "measured_on": "4 windows", "method": "backward elimination",
              "keep_rule": "keep", "chosen": [], "decisions": {},
              "trials": [{"steps": ["gatedsplit"], "question": "all", "kept": True,
                          "reason": "best", "figure": {"value": 0.9312, "se": 0.0112,
                                                       "costs": {"prefill": 1.2, "decode": 1.1},
                                                       "candidate": "c1"}}]}
    assert "gatedsplit                 93.1 % (± 1.1 pts), cost" in "\n".join(
        search_lines(search))
    assert "<td>93.1 % ± 1.1 pts</td>" in search_section(search)
    page = whatif_section(verdict["whatif"], verdict)
    assert "<td>93.1 % ± 1.1 pts</td>" in page and "<td>90.1 % ± 2.1 pts</td>" in page
    assert "<td>1.0321 ± 0.0040</td>" in page
    cands = {"chosen": "c1", "candidates": [
        {"label": "c1", "overrides": 2, "costs": {"prefill": 1.2, "decode": 1.1},
         "errors": {"prefill": 0}, "rules": [], "kept": True,
         "figures": _quality(1.0321, 0.9312, 0.9012, 0.75)}]}
    html = decoder_report_html("verdict", verdict, cands, "plan", {"io": {}}, "host")
    assert "<td>1.0321</td><td>93.1 %</td><td>90.1 %</td>" in html


def test_tiny_decoder_run_prints_its_top1_in_percent(tmp_path) -> None:
    """A real run (the tiny decoder, ORT) with the goal on top-1: the verdict it prints
    writes the measured shares and the goal in percent; verdict.json keeps 0-1."""
    from decoder_tiny import AMOUNTS, SEQ, byte_decoder, run_cli

    model = byte_decoder(tmp_path)
    code, printed = run_cli(["run", str(model), "--data", "stdlib-docs", "--target",
                             "hailo10h", "--metric", "top1_agreement", "--goal", "0.5",
                             "--seq-len", str(SEQ), *AMOUNTS, "--out", str(tmp_path / "run")])
    assert code == 0, printed
    v = json.loads((tmp_path / "run" / "verdict.json").read_text())
    f = v["figures"]["top1_agreement"]
    assert 0 < f["value"] <= 1 and v["goal"] == 0.5
    shown = f"{fmt.value('top1_agreement', f['value'])} (± {fmt.spread('top1_agreement', f['se'])})"
    pct = fmt.value("top1_agreement", f["value"])
    assert (f"    {'top1_agreement':<17} {pct:>8} (± {fmt.spread('top1_agreement', f['se'])})"
            "  prefill next-token") in printed, printed
    assert f"top1_agreement {shown} against the goal 50.0 %" in printed, printed
    assert f"{f['value']:.4f}" not in printed
