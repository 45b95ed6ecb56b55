"""``quantscope run`` on a decoder LLM (pipeline/decoder.py), on the tiny decoder."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest
from decoder_tiny import AMOUNTS, SEQ, byte_decoder
from decoder_tiny import run_cli as _run

from quantscope.analyze.prefix import after_text
from quantscope.cli import main
from quantscope.export.hailo_alls import unset_decisions
from quantscope.pipeline.decoder_report import format_decoder_verdict, host_text
from quantscope.pipeline.decoder_whatif import variants
from quantscope.pipeline.manifest import file_digest
from quantscope.types import PHASE_OVERRIDES, Plan, Precision


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> tuple:
    folder = tmp_path_factory.mktemp("decrun")
    model = byte_decoder(folder)
    before = {p.name: file_digest(p) for p in folder.iterdir()}
    out = folder / "run"
    args = ["run", str(model), "--data", "stdlib-docs", "--target", "hailo10h", "--goal",
            "1.5", "--seq-len", str(SEQ), *AMOUNTS, "--out", str(out)]
    code, printed = _run(args)
    assert code == 0
    return model, out, printed, args, before


def test_decoder_run_writes_each_phase_and_the_host_steps(ran) -> None:
    model, out, printed, _, before = ran
    assert {p.name: file_digest(p) for p in model.parent.iterdir() if p.name in before} == before
    for phase in ("prefill", "decode"):
        for name in ("model.onnx", "model.onnx.data", "quantized.qdq.onnx", "model.alls",
                     "io_snippet.py"):
            assert (out / phase / name).is_file(), (phase, name)
    assert (out / "plan.prefix.npz").is_file() and (out / "tokenizer.json").is_file()
    host = json.loads((out / "host.json").read_text())
    assert host["prefix"]["tokens"] and host["kv_cache"]["prefix_slots"] == len(
        host["prefix"]["tokens"])
    assert len(host["kv_cache"]["inputs"]) == 4  # 2 layers x key, value
    after = host["prefix"]["after"]  # what is left after the prefix, scanned and said
    assert after["windows"] > 0 and after["probed"] > 0
    assert "    after it, " in printed and after_text({"after": after}) in printed
    sinks = {**host, "prefix": {**host["prefix"], "after": {
        **after, "over": 1, "first_sinks": [[198, "Ċ", 338.0], [30, ".", 324.0]]}}}
    said = host_text(sinks)
    assert "begins with one of 'Ċ', '.' makes that token a second sink (up to 338x" in said
    assert "the calibration saw 1 window(s) with such an outlier" in said
    assert "second sink" not in host_text(host) or after["first_sinks"]
    assert {r["role"] for r in host["io"]["decode"]} == {"input", "output"}
    alls = (out / "prefill" / "model.alls").read_text()
    assert "# KV prefix: tokens" in alls and "a16_w16" in alls
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["rewrites"] == ["gatedsplit"] and verdict["errors"] == 0  # the default
    assert all(c <= 1.5 for c in verdict["costs"].values()) and verdict["overrides"] > 0
    assert verdict["goal_met"] == (verdict["figures"]["ppl_ratio"]["value"] <= 1.5)
    w4 = verdict["w4"]  # the a8_w4 variant: fewer weight bytes, cheaper decode, measured
    assert w4["measured"] and w4["layers"] > 0 and (out / "plan.w4.json").is_file()
    c = w4["checks"]
    assert c["w4.decode"]["weight_mb"] < c["w8.decode"]["weight_mb"]
    assert c["w4.decode"]["cost"] < c["w8.decode"]["cost"] == verdict["costs"]["decode"]
    assert set(w4["figures"]) == set(verdict["figures"]) and "at a8_w4 (GPTQ)" in printed
    assert "ranked by onnxruntime" in printed and "measured held out on stdlib-docs" in printed
    assert f"{verdict['figures']['ppl_ratio']['value']:.4f} (± " in printed
    # the phases' scripts cannot name the RMSNorm and RoPE Neg layers: counted and said
    unset = [w for w in verdict["export_warnings"] if "NOT SET" in w]
    per = {p: sum(w.startswith(f"{p}/model.alls: ") for w in unset) for p in ("prefill", "decode")}
    assert all(per.values()) and sum(per.values()) == len(unset)
    assert f"warning: {len(unset)} plan decision(s) NOT SET in the compiler files " \
           f"(prefill/model.alls: {per['prefill']}, decode/model.alls: {per['decode']})" in printed
    assert "RMSNormalization" in printed and "(--phase-hn prefill=P.hn --phase-hn decode=D.hn)" in printed
    # ... and measured as the compiler would apply the scripts, beside the plan
    rows = {r["label"]: r for r in json.loads((out / "whatif.json").read_text())["variants"]}
    assert set(rows) == {"plan", "as-scripted"} and verdict["whatif"]["asked"] is False
    assert "  as the phase scripts are written (" in printed
    assert "the goal as scripted: " in printed and "  whatif (--whatif" not in printed
    # the residual peaks by position, without the prefix and after it: recorded, plotted
    rec = verdict["prefix"]
    assert len(rec["profile_before"]) == SEQ and rec["after"]["profile"]
    # position 0's largest ratio over the windows is at least their median, the line's
    assert rec["profile_before"][0] >= rec["first_position_ratio"] * (1 - 1e-3)
    assert "profile" not in after  # host.json keeps what the host needs
    page = (out / "report.html").read_text()
    assert "<h2>KV prefix</h2>" in page
    assert 'alt="residual peaks by position, without and after the KV prefix"' in page


@pytest.mark.slow
def test_decoder_run_figures_equal_a_fresh_check(ran, capsys) -> None:
    """What the verdict reports is what ``check --phase --quality`` measures on the run's
    graphs with its plan and the same amounts."""
    _, out, _, _, _ = ran
    evaluated = json.loads((out / "evaluate.json").read_text())["plans"]["plan"]
    assert main(["check", str(out / "plan.json"), "--model", str(out / "model" /
                 "model.prefill.onnx"), "--target", "hailo10h", "--phase", "prefill,decode",
                 "--seq-len", str(SEQ), "--quality", *AMOUNTS]) == 0
    printed = capsys.readouterr().out
    for phase in ("prefill", "decode_fp32_kv", "decode_emu_kv"):
        v = evaluated[phase]
        assert (f"plan           {phase:<16} {100 * v['top1_agreement']:>5.1f} % {v['kl']:>9.4f} "
                f"{v['ppl_ratio']:>10.4f}") in printed


def test_exported_prefill_reads_the_prefix_and_runs_in_ort(ran) -> None:
    """The float prefill graph the compiler gets holds the prefix: on a prompt its logits
    equal the rewritten graph's on prefix + prompt; the QDQ models run in ORT."""
    from quantscope.stages_llm import open_phase
    from quantscope.tasks.lm_phases import runner

    _, out, _, _, _ = ran
    tokens = json.loads((out / "host.json").read_text())["prefix"]["tokens"]
    prompt = np.array([72, 101, 108, 108, 111, 32, 119], np.int64)
    exported = ort.InferenceSession(str(out / "prefill" / "model.onnx"))
    got = exported.run(["logits"], {"input_ids": prompt[None]})[0]
    whole = runner(open_phase(out / "model" / "model.prefill.onnx", "prefill"))
    want = whole({"input_ids": np.array([[*tokens, *prompt]], np.int64)})["logits"]
    np.testing.assert_allclose(got[0], want[0, len(tokens):], rtol=1e-4, atol=1e-4)
    for phase in ("prefill", "decode"):
        ort.InferenceSession(str(out / phase / "quantized.qdq.onnx"))


def test_decoder_rerun_skips_every_stage_and_force_reruns_from_one(ran) -> None:
    _, out, _, args, _ = ran
    verdict = (out / "verdict.json").read_bytes()
    code, printed = _run(args)
    assert code == 0 and "stages run: none" in printed
    code, printed = _run([*args, "--force", "report"])
    assert code == 0 and "stages run: report;" in printed
    assert (out / "verdict.json").read_bytes() == verdict


def test_decoder_run_names_a_phase_layers_from_its_parsed_hn(ran, tmp_path) -> None:
    """--phase-hn prefill=HN: the prefill script takes that HN's exact name for a layer no
    guess names (an RMSNormalization), one NOT SET fewer; only export, the report and the
    whatif stage (not asked: nothing measured) run again (a copy of the run folder)."""
    _, out, _, args, _ = ran
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    unset = unset_decisions((copy / "prefill" / "model.alls").read_text())
    norm = next(ln.split(":")[0] for ln in unset if "RMSNormalization" in ln)
    hn = tmp_path / "prefill.hn"
    hn.write_text(json.dumps({"name": "p", "layers": {
        "p/layer_normalization7": {"type": "layer_normalization", "original_names": [norm]}}}))
    at = args.index("--out")
    code, printed = _run([*args[:at], "--out", str(copy), "--phase-hn", f"prefill={hn}"])
    assert code == 0 and "stages run: whatif, export, report;" in printed  # whatif: not asked
    text = (copy / "prefill" / "model.alls").read_text()
    assert "quantization_param(layer_normalization7, precision_mode=a16_w16)" in text
    assert "from the HN; any others guessed by op order" in text
    assert len(unset_decisions(text)) == len(unset) - 1
    assert (copy / "decode" / "model.alls").read_text() == (
        out / "decode" / "model.alls").read_text()
    verdict = json.loads((copy / "verdict.json").read_text())
    assert sum(w.startswith("prefill/model.alls: ") and "NOT SET" in w
               for w in verdict["export_warnings"]) == len(unset) - 1


def test_decoder_whatif_measures_and_checks_each_variant(ran, tmp_path) -> None:
    """--whatif on a copy of the run: the plan with each class lifted (and decode not
    quantized), measured and checked; the rows that share a phase plan share its figures,
    float is illegal on the target, the plan itself ships at its costs."""
    _, out, _, args, _ = ran
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    at = args.index("--out")
    code, printed = _run([*args[:at], "--out", str(copy), "--whatif"])
    assert code == 0 and "stages run: whatif, report;" in printed
    doc = json.loads((copy / "whatif.json").read_text())
    rows = {r["label"]: r for r in doc["variants"]}
    fixed = {"plan", "as-scripted", "all16", "decode-float", "prefill16-decode-float"}
    assert fixed <= set(rows) and all(k.startswith("+") for k in set(rows) - fixed)
    verdict = json.loads((copy / "verdict.json").read_text())
    assert rows["plan"]["ships"] and rows["plan"]["costs"] == pytest.approx(verdict["costs"])
    for same, base in (("decode-float", "plan"), ("prefill16-decode-float", "all16")):
        for k in ("ppl_ratio", "top1_agreement"):  # the same prefill plan, the same windows
            assert rows[same]["figures"][k] == rows[base]["figures"][k]
    assert "precision.not_allowed" in rows["decode-float"]["rules"]
    # as the compiler would apply the scripts: their NOT SET decisions at the default
    for phase in ("prefill", "decode"):
        lost = [ln for ln in unset_decisions((copy / phase / "model.alls").read_text())
                if ln.split(": ")[1].split()[0] != "a8_w8"]
        assert lost and rows["as-scripted"]["changed"][phase] == len(lost)
        assert rows["as-scripted"]["costs"][phase] < rows["plan"]["costs"][phase]
    assert not rows["decode-float"]["ships"]
    assert "  whatif (--whatif, " in printed and "decode-float: decode not quantized" in printed
    page = (copy / "report.html").read_text()
    assert "<h2>What if</h2>" in page and 'alt="whatif: each variant' in page
    reach = verdict["whatif"]["reach"]  # --goal 1.5 on ppl_ratio: the plan reaches it
    assert "plan" in reach["reach"] and "plan" in reach["ship"]
    assert (out / "verdict.json").read_text() != (copy / "verdict.json").read_text()
    # a missed goal points at --whatif, until it has been run
    before = json.loads((out / "verdict.json").read_text())
    assert "rerun with --whatif" in format_decoder_verdict({**before, "goal_met": False})
    assert "rerun with --whatif" not in format_decoder_verdict({**verdict, "goal_met": False})
    assert "rerun with --whatif" not in format_decoder_verdict(before)  # goal reached


def test_whatif_variants_lift_a_class_in_both_phases_over_the_phase_overrides() -> None:
    names = {"prefill": ["layers.0.attn.scores", "layers.0.mlp.up_proj"],
             "decode": ["layers.0.attn.scores", "layers.0.mlp.up_proj"]}
    plan = Plan(default=Precision.A8_W8, target="hailo10h", meta=(
        (PHASE_OVERRIDES, json.dumps({"decode": {"layers.0.mlp.up_proj": "a16_w8"}})),))
    got = {label: per for label, _, per in variants(plan, names)}
    assert got["plan"]["decode"].precision_of("layers.0.mlp.up_proj") is Precision.A16_W8
    for phase in ("prefill", "decode"):
        lifted = got["+proj"][phase]
        assert lifted.precision_of("layers.0.mlp.up_proj") is Precision.A16_W16
        assert lifted.for_phase(phase) == lifted  # no phase entry left to undo it
        assert lifted.precision_of("layers.0.attn.scores") is Precision.A8_W8
    assert got["decode-float"]["decode"].precision_of("layers.0.attn.scores") is Precision.FLOAT
    assert got["decode-float"]["prefill"] == got["plan"]["prefill"]


@pytest.mark.parametrize("extra, words", [
    (["--lengths", "64"], "--lengths: not for a decoder LLM's run"),
    (["--rank-engine", "torch", "--headsplit"], "--rank-engine, --headsplit: not for"),
    (["--goal", "0.97"], "asks for a perplexity below FP32's"),
    (["--goal", "30"], "accepts a perplexity 30x FP32's"),  # dB taken for a ratio
    (["--phase", "prefill,decode"], "run takes no --phase"),  # plan and analyze take it
    (["--metric", "top1_agreement", "--goal", "3"], "no fraction for --metric top1_agreement"),
    (["--metric", "sqnr_db"], "is not a decoder's"),
    (["--rewrites", "tokensplit"], "is an encoder rewrite"),
    (["--data", "faces"], "stdlib-docs text only"),
    (["--phase-hn", "middle=HN"], "the phases are prefill and decode"),
    (["--phase-hn", "prefill=HN"], "has no 'layers' table"),
    (["--phase-hn", "prefill"], "is not PHASE=HN"),
])
def test_decoder_run_refuses_what_it_cannot_do(tmp_path, capsys, extra, words) -> None:
    model = byte_decoder(tmp_path)
    (tmp_path / "x.hn").write_text('{"nodes": []}')  # JSON, but no parsed HN
    extra = [a.replace("HN", str(tmp_path / "x.hn")) for a in extra]
    before = {p.name: file_digest(p) for p in tmp_path.iterdir()}
    args = ["run", str(model), "--data", "stdlib-docs", "--target", "hailo10h", "--out",
            str(tmp_path / "run")]
    if "--data" in extra:
        args = [a for a in args if a != "stdlib-docs" and a != "--data"]
    assert main([*args, *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
    assert {p.name: file_digest(p) for p in tmp_path.iterdir()} == before


def test_decoder_run_without_rewrites_nor_prefix(tmp_path) -> None:
    """--rewrites none --prefix none: the given graphs planned and measured as they are."""
    model = byte_decoder(tmp_path)
    out = tmp_path / "run"
    code, printed = _run(["run", str(model), "--data", "stdlib-docs", "--target", "hailo10h",
                          "--rewrites", "none", "--prefix", "none", "--w4", "off", "--seq-len",
                          str(SEQ), *AMOUNTS, "--out", str(out)])
    assert code == 0 and not (out / "model").exists() and not (out / "plan.prefix.npz").exists()
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["rewrites"] == [] and verdict["prefix"] is None
    assert verdict["w4"] == {"asked": False} and "a8_w4 weights: not asked" in printed
    assert "# KV prefix" not in (out / "prefill" / "model.alls").read_text()
    host = json.loads((out / "host.json").read_text())
    assert host["prefix"] is None and host["kv_cache"]["first_prompt_position"] == 0
