"""Per-phase activation precision of a decoder plan (``meta['phase_overrides']``): groups
a target refuses at 16 bit in prefill's N-token tensors but allows in decode's 1-token
ones go to 16 bit in the decode graph only."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from decoder_tiny import byte_decoder

from quantscope.plan.phase_search import candidate_plans, rank_by_range
from quantscope.plan.phases import check_phases
from quantscope.serde import read_plan, write_plan
from quantscope.stages_llm import open_phase_models
from quantscope.targets import load_target
from quantscope.types import PHASE_OVERRIDES, Plan, Precision

SEQ = 32


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The tiny decoder and hailo10h with its 16-bit size limit lowered to 1,000 values,
    so that prefill's [32, 48] tensors are over it and decode's [1, 48] under it."""
    import quantscope.targets as targets

    folder = tmp_path_factory.mktemp("phaseover")
    model = byte_decoder(folder)
    text = (Path(targets.__file__).parent / "hailo10h.toml").read_text()
    assert "max_values = { value = 98304" in text
    toml = folder / "small10h.toml"
    toml.write_text(text.replace("max_values = { value = 98304", "max_values = { value = 1000")
                    .replace('name = "hailo10h"', 'name = "small10h"'))
    models = open_phase_models(model)
    from quantscope.model.groups import find_groups

    ranked = rank_by_range(find_groups(models["prefill"]), [])
    plans = candidate_plans(models, load_target(toml), ranked, SEQ, 1.5)
    # as plan_phases names a profile file: by its path, which loads again
    plans = {k: dataclasses.replace(p, target=str(toml)) for k, p in plans.items()}
    return model, toml, models, plans


def test_decode_only_groups_are_legal_there_and_refused_in_prefill(setup) -> None:
    _, toml, models, plans = setup
    target = load_target(toml)
    assert "act16+dec16" in plans and "act16" in plans
    plan = plans["act16+dec16"]
    extra = plan.phase_overrides()["decode"]
    assert extra and set(extra).isdisjoint(dict(plan.overrides))
    assert all(p is Precision.A16_W16 for p in extra.values())
    assert plan.for_phase("prefill") == plan
    assert dict(plan.for_phase("decode").overrides) == {**dict(plan.overrides), **extra}
    # the shared part is act16's; legal on both phases, decode dearer than act16's
    assert dict(plan.overrides) == dict(plans["act16"].overrides)
    checks = {c.phase: c for c in check_phases(plan, models, target, SEQ)}
    base = {c.phase: c for c in check_phases(plans["act16"], models, target, SEQ)}
    assert checks["prefill"].errors == checks["decode"].errors == 0
    assert checks["prefill"].cost == base["prefill"].cost
    assert checks["decode"].cost > base["decode"].cost
    # the same groups in prefill are what the target refuses there
    everywhere = Plan(default=Precision.A8_W8, target=str(toml),
                      overrides=tuple({**dict(plan.overrides), **extra}.items()))
    pre = check_phases(everywhere, {"prefill": models["prefill"]}, target, SEQ)[0]
    assert {p.rule for p in pre.problems if p.severity == "error"} == {"hailo.super_defuse"}


def test_phase_overrides_survive_the_plan_file_and_reach_the_export(setup, tmp_path) -> None:
    from quantscope.export.hailo_alls import export_alls
    from quantscope.model.groups import find_groups

    _, _, models, plans = setup
    plan = plans["act16+w16+dec16"]
    write_plan(tmp_path / "p.json", plan)
    back = read_plan(tmp_path / "p.json")
    assert dict(back.meta)[PHASE_OVERRIDES] == dict(plan.meta)[PHASE_OVERRIDES]
    assert back.for_phase("decode") == plan.for_phase("decode")
    scripts = {p: export_alls(back.for_phase(p), find_groups(models[p])) for p in models}
    assert (scripts["decode"].count("a16_w16") > scripts["prefill"].count("a16_w16") > 0)


def test_measuring_a_plan_uses_each_phases_own_precisions(setup) -> None:
    from quantscope.stages_llm import LmSetup, _opener, lm_text
    from quantscope.tasks.lm_phases import calibrate_phases, evaluate_lm_plans

    model, _, _, plans = setup
    plan = plans["act16+dec16"]
    lm = LmSetup(seq_len=SEQ, calibration=4, evaluation=2, steps=4, prompts=2, new_tokens=6)
    windows, prompts = lm_text(model, lm)
    op = _opener(model)
    stats = calibrate_phases(op, windows, steps=lm.steps)
    kw = {"prompts": prompts, "steps": lm.steps, "new_tokens": lm.new_tokens}
    got = evaluate_lm_plans(op, stats, {"p": plan, "split": {p: plan.for_phase(p) for p in
                                                              ("prefill", "decode")},
                                        "shared": plans["act16"]}, windows, **kw)
    for phase in ("prefill", "decode_fp32_kv", "decode_emu_kv", "greedy"):
        assert {k: v for k, v in got["p"][phase].items()} == got["split"][phase]
    assert got["p"]["prefill"] == got["shared"]["prefill"]  # prefill is act16's
    assert got["p"]["decode_fp32_kv"] != got["shared"]["decode_fp32_kv"]
