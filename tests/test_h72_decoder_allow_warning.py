"""``--allow-warning RULE`` on a decoder (h72): ``plan --phase``, ``check --phase`` and
``run`` on a prefill/decode pair take it as the encoder commands do. The phase search's
screen is the planner's one rule (``plan.start.blocks``): a warning that applies blocks a
candidate (before, only errors did: hailo8's ``hailo.attention_16bit`` let 16-bit attention
into a decoder plan unsaid) unless its rule is accepted; the plan records what the rule
lets through; ``check --phase`` lists those warnings as accepted; an error rule or an
unknown id is refused in one line."""

from __future__ import annotations

import html
import json

import pytest
from decoder_tiny import AMOUNTS, SEQ, byte_decoder, run_cli

from quantscope.model.phases import PHASES
from quantscope.plan.accepted import accepted_of
from quantscope.plan.phase_search import candidate_plans, screen
from quantscope.plan.phases import phase_screen
from quantscope.serde import read_plan, write_plan
from quantscope.stages_llm import check_plan_phases, open_phase_models
from quantscope.targets import load_target
from quantscope.types import Plan, Precision

RULE = "hailo.attention_16bit"  # a warning on hailo8: 16-bit attention (Softmax, act x act)
HAILO8 = load_target("hailo8")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return byte_decoder(tmp_path_factory.mktemp("h72"))


def _plan(tiny, tmp_path, *extra: str, target: str = "hailo8") -> tuple[int, str]:
    return run_cli(["plan", str(tiny), "--target", target, "--phase", "prefill,decode",
                    "--max-cost", "1.5", "--seq-len", str(SEQ), *AMOUNTS, *extra,
                    "--out", str(tmp_path / "plan.json")])


def test_the_phase_screen_blocks_a_warning_unless_its_rule_is_accepted(tiny) -> None:
    models = open_phase_models(tiny)
    uniform = {"a16_w16": Plan(default=Precision.A16_W16, target="hailo8"),
               "a8_w8": Plan(default=Precision.A8_W8, target="hailo8")}
    strict = {c.label: c for c in screen(uniform, models, HAILO8, SEQ)}
    a16 = strict["a16_w16"]
    # no error on hailo8: the warnings alone make it illegal, each one the planner's
    assert a16.errors == 0 and a16.blocking > 0
    assert {p.rule for k in a16.checks for p in k.warned} == {RULE}
    # the model's ops.* notes, which uniform a8_w8 carries too, block nothing
    assert strict["a8_w8"].blocking == 0 and any(k.problems for k in strict["a8_w8"].checks)
    legal = phase_screen(models, HAILO8, SEQ, frozenset({RULE}))
    loose = {c.label: c for c in screen(uniform, models, HAILO8, SEQ, legal)}
    assert loose["a16_w16"].blocking == 0
    assert {p.rule for k in loose["a16_w16"].checks for p in k.accepted} == {RULE}
    # the candidates: without the rule no 16-bit attention group in any of them
    attention = {p.group for k in a16.checks for p in k.warned}
    ranked: list[str] = []  # no ranking: graph order
    plans = candidate_plans(models, HAILO8, ranked, SEQ, 1.5)
    for label, plan in plans.items():
        if plan.default is Precision.A8_W8:
            assert not attention & {n for p in PHASES for n, _ in plan.for_phase(p).overrides
                                    }, label
    plans = candidate_plans(models, HAILO8, ranked, SEQ, 1.5, legal)
    assert any(attention & {n for n, _ in plan.overrides} for plan in plans.values())


def test_no_kept_candidate_names_the_warning_rules_that_block_them() -> None:
    from quantscope.plan.phase_search import PhaseCandidate, kept_plans
    from quantscope.plan.phases import PhaseCheck
    from quantscope.types import Problem, QuantscopeError

    warned = (Problem(group="g", rule=RULE, reason="", provenance="", fix="",
                      severity="warning"),)
    only = PhaseCandidate("a16", Plan(default=Precision.A16_W16), (
        PhaseCheck("prefill", SEQ, warned, 1.2, warned=warned),))
    over = PhaseCandidate("a8", Plan(default=Precision.A8_W8), (
        PhaseCheck("prefill", SEQ, (), 1.3),))  # over the cap
    assert only.errors == 0 and not only.kept(1.5)
    with pytest.raises(QuantscopeError, match=f"--allow-warning {RULE}\\)$"):
        kept_plans((only, over), 1.25)


def test_plan_phase_blocks_the_warned_attention_and_accepts_it_when_asked(tiny, tmp_path
                                                                         ) -> None:
    code, text = _plan(tiny, tmp_path)
    assert code == 0, text
    strict = read_plan(tmp_path / "plan.json")
    assert accepted_of(strict) == [] and "accepted by" not in text
    checks = check_plan_phases(tiny, strict, PHASES, SEQ)
    assert not [p for c in checks for p in c.problems if p.rule == RULE]
    line = next(ln for ln in text.splitlines() if ln.startswith("a16_w16 "))
    assert f"no ({RULE} (warning))" in line, line
    code, text = _plan(tiny, tmp_path, "--allow-warning", RULE)
    assert code == 0, text
    loose = read_plan(tmp_path / "plan.json")
    record = accepted_of(loose)
    reason = next(r.reason for r in HAILO8.rules if r.id == RULE)
    checks = check_plan_phases(tiny, loose, PHASES, SEQ, frozenset({RULE}))
    groups = list(dict.fromkeys(p.group for c in checks for p in c.accepted))
    assert groups and all(c.blocking == 0 for c in checks)
    phases = {c.phase: list(dict.fromkeys(p.group for p in c.accepted)) for c in checks}
    assert record == [{"rule": RULE, "reason": reason, "groups": len(groups),
                       "group_names": groups, "phases": phases}]
    assert f"accepted by --allow-warning: {RULE} lets {len(groups)} group(s) through" in text
    # 'all': every warning rule of hailo8 recorded, 0 groups included
    code, text = _plan(tiny, tmp_path, "--allow-warning", "all")
    assert code == 0, text
    every = {r["rule"]: r["groups"] for r in accepted_of(read_plan(tmp_path / "plan.json"))}
    assert set(every) == {r.id for r in HAILO8.rules if r.severity == "warning"}


def test_check_phase_lists_the_accepted_warnings_apart(tiny, tmp_path) -> None:
    path = tmp_path / "a16.json"
    write_plan(path, Plan(default=Precision.A16_W16, target="hailo8"))
    base = ["check", str(path), "--model", str(tiny), "--target", "hailo8", "--phase",
            "prefill,decode", "--seq-len", str(SEQ)]
    code, text = run_cli(base)
    assert code == 0 and f"  warning: [{RULE}]" in text and "accepted by" not in text, text
    code, text = run_cli([*base, "--allow-warning", RULE])
    assert code == 0, text
    assert f"  accepted by --allow-warning: [{RULE}]" in text
    assert f"  warning: [{RULE}]" not in text
    heads = [ln for ln in text.splitlines() if ln.startswith(PHASES)]
    assert len(heads) == 2 and all("accepted by --allow-warning," in h for h in heads), heads


@pytest.mark.parametrize(("argv", "says"), [
    (["--allow-warning", "hailo.super_defuse"], "hailo.super_defuse is an error rule of hailo10h"),
    (["--allow-warning", "hailo.nope"], "hailo10h has no rule 'hailo.nope'"),
])
def test_plan_and_check_phase_refuse_an_error_rule_or_an_unknown_id(tiny, tmp_path, capsys,
                                                                    argv, says) -> None:
    out = tmp_path / "plan.json"
    code, _ = _plan(tiny, tmp_path, *argv, target="hailo10h")
    err = capsys.readouterr().err
    assert code == 2 and says in err and "hailo.maxpool_16bit" in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    write_plan(out, Plan(default=Precision.A8_W8, target="hailo10h"))
    code, _ = run_cli(["check", str(out), "--model", str(tiny), "--target", "hailo10h",
                       "--phase", "prefill,decode", "--seq-len", str(SEQ), *argv])
    err = capsys.readouterr().err
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_a_decoder_run_refuses_an_error_rule_before_any_stage(tiny, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    code, _ = run_cli(["run", str(tiny), "--data", "stdlib-docs", "--target", "hailo10h",
                       "--seq-len", str(SEQ), *AMOUNTS, "--allow-warning", "hailo.super_defuse",
                       "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "hailo.super_defuse is an error rule of hailo10h" in err, err
    assert "not for a decoder" not in err and not out.exists()


def test_the_decoder_plan_stage_is_keyed_by_the_accepted_set() -> None:
    from quantscope.pipeline.decoder import DECODER_STAGES, UNKEYED_WHEN_NONE

    assert "allow_warnings" in DECODER_STAGES["plan"].options
    assert "allow_warnings" in DECODER_STAGES["whatif"].options
    assert "allow_warnings" in UNKEYED_WHEN_NONE  # a folder made without it resumes


@pytest.mark.slow
def test_a_decoder_run_accepts_a_warning_and_every_output_says_it(tiny, tmp_path) -> None:
    out = tmp_path / "run"
    args = ["run", str(tiny), "--data", "stdlib-docs", "--target", "hailo8", "--seq-len",
            str(SEQ), *AMOUNTS, "--w4", "off", "--out", str(out)]
    code, printed = run_cli([*args, "--allow-warning", RULE])
    assert code == 0, printed
    record = accepted_of(read_plan(out / "plan.json"))
    assert [r["rule"] for r in record] == [RULE] and record[0]["groups"] > 0
    said = f"accepted by --allow-warning: {RULE} lets {record[0]['groups']} group(s) through"
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["accepted_warnings"] == record
    assert said in (out / "verdict.txt").read_text() and said in printed
    assert said in (out / "plan.txt").read_text()
    assert said in html.unescape((out / "report.html").read_text())
    for phase in PHASES:  # each phase's script says what it lets through in its own graph
        own = record[0]["phases"][phase]
        assert f"# accepted by --allow-warning: {RULE} lets {len(own)} group(s) through" in (
            out / phase / "model.alls").read_text()
    cands = json.loads((out / "candidates.json").read_text())
    assert cands["accepted_warnings"] == record
    # without it: the plan stage runs again, and nothing is accepted
    code, printed = run_cli(args)
    ran = next(ln for ln in printed.splitlines() if ln.startswith("stages run:"))
    assert code == 0 and "plan" in ran.split(";")[0], ran
    assert accepted_of(read_plan(out / "plan.json")) == []
    assert "accepted_warnings" not in json.loads((out / "verdict.json").read_text())


def test_the_a8_w4_variant_is_screened_as_the_plan_search_screens(tiny) -> None:
    """``run``'s a8_w4 variant: a warning that blocks the phase search makes it "not legal"
    too, named, and not measured; accepted, it is measured. Before, it judged errors only,
    so a variant over hailo8's 16-bit attention warning was measured as legal."""
    from quantscope.stages_llm import LmSetup
    from quantscope.stages_llm_w4 import w4_variant

    models = open_phase_models(tiny)
    a16 = {c.label: c for c in screen(
        {"a16_w16": Plan(default=Precision.A16_W16, target="hailo8")}, models, HAILO8, SEQ)}
    attention = sorted({p.group for k in a16["a16_w16"].checks for p in k.warned})
    # the weighted layers at a8_w8 (the variant's 4-bit ones), attention at 16 bit
    plan = Plan(default=Precision.A8_W8, target="hailo8",
                overrides=tuple((g, Precision.A16_W16) for g in attention))
    setup = LmSetup.at(SEQ, tokens=62, prompts=2, new_tokens=4, decode_steps=8)
    strict = w4_variant(tiny, plan, setup)
    assert strict["measured"] is False
    assert RULE in strict["checks"]["w4.prefill"]["rules"]
    assert strict["checks"]["w4.prefill"]["errors"] == 0  # a warning, not an error
    loose = w4_variant(tiny, plan, setup, allowed=frozenset({RULE}))
    assert loose["checks"]["w4.prefill"]["blocking"] == 0
    assert loose["layers"] > 0 and loose["measured"] is True and loose["quality"]


def test_each_phase_script_says_what_the_warning_lets_through_in_its_own_graph() -> None:
    """h72's leftover: a decoder plan's accepted record is the union over both phases, and
    each phase's ``.alls`` repeated it. The record now keeps each rule's groups per phase,
    and ``accepted.for_phase`` narrows it for that phase's script; an encoder's record
    (no phases) is left as it is."""
    from quantscope.plan.accepted import accepted_lines, for_phase, with_accepted
    from quantscope.plan.phases import PhaseCheck, phase_accepted
    from quantscope.types import Problem

    def warned(group: str) -> Problem:
        return Problem(group=group, rule=RULE, reason="16-bit attention", provenance="test",
                       fix="", severity="warning")

    checks = (PhaseCheck("prefill", SEQ, (), 1.0, accepted=(warned("a"), warned("b"))),
              PhaseCheck("decode", SEQ, (), 1.0, accepted=(warned("b"),)))
    record = phase_accepted(HAILO8, checks, frozenset({RULE}))
    assert record[0]["groups"] == 2 and record[0]["group_names"] == ["a", "b"]
    assert record[0]["phases"] == {"prefill": ["a", "b"], "decode": ["b"]}
    plan = with_accepted(Plan(default=Precision.A8_W8, target="hailo8"), record)
    said = {ph: accepted_lines(accepted_of(for_phase(plan, ph))) for ph in PHASES}
    assert " lets 2 group(s) through" in said["prefill"][0]
    assert " lets 1 group(s) through" in said["decode"][0]
    encoder = with_accepted(Plan(default=Precision.A8_W8, target="hailo8"),
                            [{k: v for k, v in record[0].items() if k != "phases"}])
    assert for_phase(encoder, "decode") is encoder
