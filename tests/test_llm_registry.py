"""The decoder recipe's steps are rewrite registry entries: each name of
``stages_llm.RECIPE`` is a ``REWRITES`` entry, the recipe runs them by the registry (a
new step is one entry, no other edit), an encoder's ``auto`` choice never tries one, and
the recipe leaves the tiny decoder's FP32 function as it was on both phase graphs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from decoder_tiny import byte_decoder
from test_repair_heads import SEQ as HEAD_SEQ
from test_repair_heads import _encoder as attention_encoder

from quantscope import stages_llm
from quantscope.model.load import load_proto
from quantscope.model.phases import phase_shapes
from quantscope.repair.rotate_heads import value_basis
from quantscope.repair.tokens import sample_feeds
from quantscope.rewrites.auto import choose_rewrites, should_try
from quantscope.rewrites.registry import REWRITES
from quantscope.rewrites.smooth import RTOL
from quantscope.targets import load_target

SEQ = 16


def test_every_recipe_step_is_a_registry_entry() -> None:
    assert set(stages_llm.RECIPE) <= set(REWRITES)
    assert [n for n in REWRITES if n in stages_llm.RECIPE] == list(stages_llm.RECIPE)
    steps = {n: REWRITES[n] for n in stages_llm.RECIPE}
    assert steps["rotate"].phases is None  # its transform on each graph
    assert steps["smooth"].phases is not None and steps["gatedsplit"].phases is not None
    for rw in steps.values():
        assert rw.what and rw.summary and rw.unverified.startswith("unverified on a device")


def test_no_recipe_step_is_tried_on_an_encoder() -> None:
    """Each step's precondition says no on an encoder, in words; the encoder run's auto
    choice records them as not tried (and never measures them)."""
    model = load_proto(attention_encoder())
    target = load_target("hailo10h")
    for name in stages_llm.RECIPE:
        pre = should_try(REWRITES[name], model, target, HEAD_SEQ, None)
        assert not pre.holds, name
        assert len(pre.reason.split()) > 4, pre.reason  # a sentence, not a code
    assert "no gated MLP" in should_try(REWRITES["smooth"], model, target, HEAD_SEQ,
                                        None).reason
    assert "no gated MLP" in should_try(REWRITES["gatedsplit"], model, target, HEAD_SEQ,
                                        None).reason
    measured: list[str] = []

    def measure(m, stats):
        measured.append(m.source)
        return 1.0

    choice, _ = choose_rewrites(model, target, HEAD_SEQ, calibrate=lambda m: None,
                                measure=measure, reload=load_proto, metric="agreement")
    trials = {t.name: t for t in choice.trials}
    for name in stages_llm.RECIPE:
        assert not trials[name].tried and not trials[name].kept
        assert trials[name].reason == should_try(REWRITES[name], model, target, HEAD_SEQ,
                                                 None).reason


def test_a_new_decoder_step_is_one_entry(tmp_path, monkeypatch) -> None:
    """A step registered with its own phase hook runs in the recipe with no edit of the
    recipe: the hook is given the step's phase graphs and writes them."""
    seen: dict[str, object] = {}

    def phases(job, config):
        seen.update(spec=job.spec, seq_len=job.seq_len, config=config)
        return job.write(lambda phase: (job.open(phase).proto, f"kept {phase}"))

    entry = dataclasses.replace(REWRITES["gatedsplit"], name="mirror", phases=phases)
    monkeypatch.setitem(REWRITES, "mirror", entry)
    monkeypatch.setattr(stages_llm, "RECIPE", (*stages_llm.RECIPE, "mirror"))
    model = byte_decoder(tmp_path)
    out = tmp_path / "r" / "m.prefill.onnx"
    out.parent.mkdir()
    notes = stages_llm.recipe_phase_files(model, ("mirror",), out, seq_len=SEQ)
    assert notes == {"mirror": {"prefill": "kept prefill", "decode": "kept decode"}}
    assert seen == {"spec": str(model), "seq_len": SEQ, "config": entry.config()}
    assert out.is_file() and out.with_name("m.decode.onnx").is_file()


def _outputs(proto, feeds):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return [sess.run(None, f) for f in feeds]


@pytest.mark.parametrize("target", ["hailo10h", "small"])
def test_the_recipe_keeps_both_phase_graphs_fp32(tmp_path, target) -> None:
    """rotate, vrotate, smooth, gatedsplit on the tiny decoder through the registry: every
    step's note, the intermediate files removed, and each phase graph's outputs within the
    recipe's FP32 bound (``rewrites.smooth.RTOL``) of the given graphs' (the decode graph
    fed its V cache in vrotate's basis, as its own prefill graph writes it). gatedsplit splits
    prefill only where the target's size rule refuses the 16-token layers at 16 bit (a
    500-value limit), not on hailo10h."""
    import quantscope.targets as targets

    model = byte_decoder(tmp_path)
    given = target
    if target == "small":
        text = (Path(targets.__file__).parent / "hailo10h.toml").read_text()
        toml = tmp_path / "small10h.toml"
        toml.write_text(text
                        .replace("max_values = { value = 98304", "max_values = { value = 500")
                        .replace('name = "hailo10h"', 'name = "small10h"'))
        given = str(toml)
    out = tmp_path / "r" / "model.prefill.onnx"
    out.parent.mkdir()
    said: list[str] = []
    notes = stages_llm.recipe_phase_files(model, stages_llm.RECIPE, out, seq_len=SEQ,
                                          prefix="none", say=said.append, target=given)
    assert list(notes) == list(stages_llm.RECIPE) and len(said) == len(stages_llm.RECIPE)
    for name in stages_llm.RECIPE:
        assert set(notes[name]) == {"prefill", "decode"}
    assert "FP32 max relative diff" in notes["rotate"]["prefill"]
    assert notes["gatedsplit"]["decode"].startswith("unchanged")
    split = target == "small"
    assert notes["gatedsplit"]["prefill"].startswith("not applied") is not split
    assert not [p for p in out.parent.iterdir() if p.name.startswith("step")]
    for phase in ("prefill", "decode"):
        before = stages_llm.open_phase(model, phase)
        after = stages_llm.open_phase(out, phase)
        assert any(n.name.endswith("/tok1") for n in after.graph.node) is (
            split and phase == "prefill")
        feeds = sample_feeds(before, (SEQ,), what="test",
                             shapes=phase_shapes(before, phase, SEQ))
        basis = value_basis(before)
        assert len(basis) == (2 if phase == "prefill" else 4)  # present (+ past) values
        rotated = [{k: (v @ basis[k]).astype(v.dtype) if k in basis else v
                    for k, v in f.items()} for f in feeds]
        for ref, new in zip(_outputs(before.proto, feeds), _outputs(after.proto, rotated),
                            strict=True):
            scale = float(np.abs(ref[0]).max())
            assert float(np.abs(new[0] - ref[0]).max()) <= RTOL * scale, phase


def test_the_decoder_steps_run_on_one_graph_through_the_runner(tmp_path) -> None:
    """``smooth`` and ``gatedsplit`` are whole entries: on one prefill graph the registry's
    runner applies them, FP32 checked and recorded (what ``quantscope smooth`` /
    ``quantscope gatedsplit`` run)."""
    setup = stages_llm.LmSetup(seq_len=SEQ, calibration=4, evaluation=2, steps=2)
    job = stages_llm.phase_job(byte_decoder(tmp_path), "smooth", tmp_path / "x.prefill.onnx",
                               setup)
    prefill = job.open("prefill")
    smooth = REWRITES["smooth"].apply(prefill, stats=job.calibrate(), seq_len=SEQ)
    split = REWRITES["gatedsplit"].apply(prefill, seq_len=SEQ)
    assert smooth.applied and smooth.record["name"] == "smooth" and smooth.fp32_diff < RTOL
    assert split.applied and "2 chunks of 8 tokens" in split.reason
    assert "give --seq-len" in REWRITES["gatedsplit"].apply(prefill).reason


def test_the_decode_graph_reads_the_weights_both_graphs_have_from_the_prefill_file(
        tmp_path) -> None:
    """write_phase_files writes each weight once: the decode graph's equal weights are
    references into the prefill graph's data file, its own file holds only what prefill
    lacks (here nothing: no such file), both graphs load and run as the originals do, and
    a weight that differs between the graphs is still refused."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    from quantscope.types import QuantscopeError

    model = byte_decoder(tmp_path)
    out = tmp_path / "w" / "m.prefill.onnx"
    out.parent.mkdir()
    stages_llm.write_phase_files(model, "copy", lambda p: (
        stages_llm.open_phase(model, p).proto, ""), out)
    decode = out.with_name("m.decode.onnx")
    light = onnx.load(str(decode), load_external_data=False)
    where = {ExternalDataInfo(t).location for t in light.graph.initializer
             if uses_external_data(t)}
    assert where == {"m.prefill.onnx.data"} and not decode.with_name("m.decode.onnx.data").exists()
    prefill_bytes = out.with_name("m.prefill.onnx.data").stat().st_size
    weights = sum(len(t.raw_data) for t in stages_llm.open_phase(model, "decode").proto
                  .graph.initializer if len(t.raw_data) >= 1024)
    assert prefill_bytes >= weights > 0
    for phase in ("prefill", "decode"):
        before, after = stages_llm.open_phase(model, phase), stages_llm.open_phase(out, phase)
        feeds = sample_feeds(before, (SEQ,), what="test",
                             shapes=phase_shapes(before, phase, SEQ))
        # ONNX Runtime opens the written file itself: the decode graph's weights are read
        # from the prefill graph's data file
        sess = ort.InferenceSession(after.source, providers=["CPUExecutionProvider"])
        for ref, new in zip(_outputs(before.proto, feeds), [sess.run(None, f) for f in feeds],
                            strict=True):
            assert np.array_equal(ref[0], new[0]), phase
    changed = stages_llm.open_phase(model, "decode").proto
    name = next(t.name for t in changed.graph.initializer if len(t.raw_data) >= 1024)

    def make(phase: str):
        proto = stages_llm.open_phase(model, phase).proto
        if phase == "decode":
            t = next(t for t in proto.graph.initializer if t.name == name)
            t.raw_data = bytes(len(t.raw_data))
        return proto, ""

    with pytest.raises(QuantscopeError, match=f"weight '{name}' differs"):
        stages_llm.write_phase_files(model, "copy", make, tmp_path / "x.prefill.onnx")
    assert not list(tmp_path.glob("x.*.onnx*"))
