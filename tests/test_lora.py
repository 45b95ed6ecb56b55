"""A LoRA adapter on the tiny decoder: merged vs kept beside the base (model/lora.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from decoder_tiny import byte_decoder

from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.lora import (
    attach_adapter,
    merge_adapter,
    read_adapter,
    synthetic_adapter,
)
from quantscope.tasks.lm_phases import runner
from quantscope.types import Plan, Precision, QuantscopeError

PROMPT = np.array([[72, 101, 108, 108, 111, 32, 119, 111, 114]], np.int64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lora")
    return byte_decoder(folder)


def test_synthetic_adapter_has_the_asked_rank_and_strength(tiny, tmp_path) -> None:
    proto = onnx.load(str(tiny))
    ad = synthetic_adapter(proto, rank=4, strength=0.2, seed=1)
    assert ad.names == ("layers.0.q_proj", "layers.0.v_proj", "layers.1.q_proj",
                        "layers.1.v_proj")
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    for name in ad.names:
        d = ad.delta(name)
        assert np.linalg.matrix_rank(d) == 4
        w = inits[f"{name}.weight.T"]
        assert np.linalg.norm(d) / np.linalg.norm(w) == pytest.approx(0.2, rel=1e-5)
    ad.save(tmp_path / "a.npz")
    back = read_adapter(tmp_path / "a.npz")
    assert back.names == ad.names
    np.testing.assert_array_equal(back.delta(ad.names[0]), ad.delta(ad.names[0]))
    (tmp_path / "bad.npz").write_bytes(b"no zip")
    with pytest.raises(QuantscopeError, match="not a LoRA adapter file"):
        read_adapter(tmp_path / "bad.npz")


def test_attached_equals_merged_in_fp32_and_changes_the_base(tiny) -> None:
    proto = onnx.load(str(tiny))
    ad = synthetic_adapter(proto, rank=4, strength=0.2)
    merged, attached = merge_adapter(proto, ad), attach_adapter(proto, ad)
    base = runner(proto)({"input_ids": PROMPT})["logits"]
    a = runner(merged)({"input_ids": PROMPT})["logits"]
    b = runner(attached)({"input_ids": PROMPT})["logits"]
    assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
    assert np.abs(a - base).max() > 0.05 * np.abs(base).max()  # the adapter does something
    # every original node keeps its name; three nodes per adapted Linear are added
    names = {n.name for n in attached.graph.node}
    assert {n.name for n in proto.graph.node} <= names
    assert len(attached.graph.node) == len(proto.graph.node) + 3 * len(ad.layers)
    groups = find_groups(Model(proto=attached, source="attached")).names()
    assert {f"layers.0.q_proj{s}" for s in (".lora_a", ".lora_b", ".lora_add")} <= set(groups)


def test_rotate_folds_into_the_adapter_exactly(tiny) -> None:
    """lora_a reads the RMSNorm output like the Linear beside it: the rotation folds γ and
    R into it, and the rotated attached graph is the merged one's function."""
    from quantscope.repair.rotate import rotate_stream

    proto = onnx.load(str(tiny))
    ad = synthetic_adapter(proto, rank=4, strength=0.2)
    rotated = rotate_stream(Model(proto=attach_adapter(proto, ad), source="attached"))
    a = runner(merge_adapter(proto, ad))({"input_ids": PROMPT})["logits"]
    b = runner(rotated.proto)({"input_ids": PROMPT})["logits"]
    assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()


def test_adapter_files_and_the_separate_plan(tiny, tmp_path) -> None:
    """Both phase files with the adapter attached (FP32-checked against the merged ones),
    the merged plan with the adapter's groups at a16_w16, legal on both phases."""
    from quantscope.plan.phases import check_phases
    from quantscope.stages_llm import open_phase_models
    from quantscope.stages_lora import adapter_phase_files, separate_plan
    from quantscope.targets import load_target

    ad = synthetic_adapter(onnx.load(str(tiny)), rank=4, strength=0.2)
    notes = adapter_phase_files(tiny, ad, tmp_path / "sep.prefill.onnx", merged=False)
    assert set(notes) == {"prefill", "decode"} and "FP32 max relative diff" in notes["decode"]
    adapter_phase_files(tiny, ad, tmp_path / "mrg.prefill.onnx", merged=True)
    models = open_phase_models(tmp_path / "sep.prefill.onnx")
    groups = find_groups(models["prefill"]).names()
    base = Plan(default=Precision.A8_W8, target="hailo10h",
                overrides=(("layers.0.q_proj", Precision.A16_W16),))
    plan = separate_plan(base, groups, ad)
    over = dict(plan.overrides)
    assert over["layers.0.q_proj"] is Precision.A16_W16
    assert sum(k.endswith(".lora_b") for k in over) == len(ad.layers)
    assert all(v is Precision.A16_W16 for v in over.values())
    checks = check_phases(plan, models, load_target("hailo10h"), 32)
    assert [c.errors for c in checks] == [0, 0]
    with pytest.raises(QuantscopeError, match="no adapter groups"):
        separate_plan(base, find_groups(open_phase_models(tiny)["prefill"]).names(), ad)
