"""The decoder recipe's ``gatedsplit`` reads ``--allow-warning`` as the planner does (h78).

Its chunk is the largest the target's size rule (``hailo.super_defuse``) allows at 16 bit;
on hailo8 / hailo8l that rule is a warning, which binds unless ``--allow-warning`` accepts
it. The step loaded its target by name, so it accepted nothing: a run that accepted the
rule still had its prefill MLPs split as if it blocked. Now the recipe reads the target as
the run does (``targets.accept.for_run``), the prefill note says which rule decided, and
the rewrite stage's key holds the accepted rules the recipe answers (absent when none, so
an older folder, or one accepting only other rules, resumes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from decoder_tiny import SEQ, byte_decoder

import quantscope.targets as targets
from quantscope.model.groups import find_groups
from quantscope.pipeline.decoder import (
    DECODER_STAGES,
    MODEL_DIR,
    REWRITE,
    DecoderContext,
    DecoderOptions,
    rewrite,
    stage_options,
)
from quantscope.stages_llm import open_phase_models, recipe_accepts, recipe_phase_files

SIZE = "hailo.super_defuse"  # a warning on hailo8 / hailo8l, an error on hailo10h
ATTENTION = "hailo.attention_16bit"
BLOCKED = (f"{SIZE} (warning, blocked by the planner: accept with --allow-warning {SIZE}) "
           "refuses 16 bit on")
ACCEPTED = f"{SIZE} accepted by --allow-warning"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return byte_decoder(tmp_path_factory.mktemp("h78"))


def _small(name: str, folder: Path) -> Path:
    """``name``'s profile with the 16-bit size limit at 1,000 values: the tiny decoder's
    [32, 48] gated products at 32 tokens are over it, [16, 48] chunks under it."""
    text = (Path(targets.__file__).parent / f"{name}.toml").read_text()
    assert "max_values = { value = 98304" in text and f'name = "{name}"' in text
    path = folder / f"small_{name}.toml"
    path.write_text(text.replace("max_values = { value = 98304", "max_values = { value = 1000")
                    .replace(f'name = "{name}"', f'name = "small_{name}"'))
    return path


def _split(out: Path) -> bool:
    names = {g.name for g in find_groups(open_phase_models(out)["prefill"]).groups}
    return "layers.0.mlp.gated/tok0" in names


@pytest.mark.parametrize("name", ["hailo8", "hailo8l"])
def test_gatedsplit_splits_where_the_size_warning_binds_and_not_where_accepted(
        tiny, tmp_path, name) -> None:
    target = str(_small(name, tmp_path))
    strict, taken, other = (tmp_path / k / "m.prefill.onnx" for k in ("s", "a", "o"))
    for out in (strict, taken, other):
        out.parent.mkdir()
    note = recipe_phase_files(tiny, ("gatedsplit",), strict, seq_len=SEQ,
                              target=target)["gatedsplit"]["prefill"]
    assert "2 chunks of 16 tokens" in note and BLOCKED in note, note
    assert f"at {SEQ} tokens" in note and _split(strict)
    note = recipe_phase_files(tiny, ("gatedsplit",), taken, seq_len=SEQ, target=target,
                              allowed=frozenset({SIZE}))["gatedsplit"]["prefill"]
    assert note.startswith("not applied") and ACCEPTED in note, note
    assert "16 bit on every token-wise layer passes the planner" in note
    assert not _split(taken)
    # another warning rule accepted: the size rule still binds
    note = recipe_phase_files(tiny, ("gatedsplit",), other, seq_len=SEQ, target=target,
                              allowed=frozenset({ATTENTION}))["gatedsplit"]["prefill"]
    assert BLOCKED in note and _split(other)


def test_the_note_names_the_error_rule_or_the_rule_that_allows(tiny, tmp_path) -> None:
    """hailo10h's size rule is an error (no flag in its words); at its real limit the
    tiny decoder's whole gated products fit, and the note says the rule allows them."""
    text = (Path(targets.__file__).parent / "hailo10h.toml").read_text()
    small = tmp_path / "small10h.toml"
    small.write_text(text.replace("max_values = { value = 98304", "max_values = { value = 1000")
                     .replace('name = "hailo10h"', 'name = "small10h"'))
    (tmp_path / "e").mkdir()
    (tmp_path / "w").mkdir()
    note = recipe_phase_files(tiny, ("gatedsplit",), tmp_path / "e" / "m.prefill.onnx",
                              seq_len=SEQ, target=str(small))["gatedsplit"]["prefill"]
    assert f"; {SIZE} refuses 16 bit on" in note and "warning" not in note, note
    note = recipe_phase_files(tiny, ("gatedsplit",), tmp_path / "w" / "m.prefill.onnx",
                              seq_len=SEQ, target="hailo10h")["gatedsplit"]["prefill"]
    assert note.startswith("not applied"), note
    assert note.endswith(f"; {SIZE} allows 16 bit on every token-wise layer at {SEQ} tokens")


def test_run_rewrite_stage_passes_the_accepted_set(tiny, tmp_path) -> None:
    """``run``'s rewrite stage (the default step, gatedsplit) on the accepted warning:
    the prefill graph whole, ``rewrite.json`` saying why."""
    target = str(_small("hailo8", tmp_path))
    for asked, split in (((SIZE,), False), (None, True)):
        folder = tmp_path / f"run-{split}"
        folder.mkdir()
        opts = DecoderOptions(model=str(tiny), target=target, out=str(folder), seq_len=SEQ,
                              allow_warnings=asked)
        rewrite(DecoderContext(opts, folder, progress=False))
        note = json.loads((folder / REWRITE).read_text())["notes"]["gatedsplit"]["prefill"]
        assert (BLOCKED if split else ACCEPTED) in note, note
        assert _split(folder / MODEL_DIR / "model.prefill.onnx") is split


def test_the_rewrite_key_holds_the_accepted_rules_the_recipe_answers() -> None:
    spec = DECODER_STAGES["rewrite"]

    def key(**kw) -> dict:
        return stage_options(spec, DecoderOptions(model="m", target="hailo8", out="o", **kw))

    before = {"rewrites": ("gatedsplit",), "seq_len": None, "prefix": "auto",
              "target": "hailo8"}  # the key of a folder made before h78
    assert key() == before
    assert key(allow_warnings=(ATTENTION,)) == before  # gatedsplit reads no attention rule
    assert key(allow_warnings=(SIZE,)) == {**before, "rewrite_accepts": [SIZE]}
    assert key(allow_warnings=("all",)) == {**before, "rewrite_accepts": [SIZE]}
    assert "rewrite_accepts" not in key(allow_warnings=(SIZE,), rewrites=("rotate",))
    assert "rewrite_accepts" not in key(allow_warnings=(SIZE,), rewrites=())
    assert recipe_accepts(("rotate", "smooth"), frozenset({SIZE, ATTENTION})) == []
    assert recipe_accepts(("gatedsplit",), frozenset({SIZE, ATTENTION})) == [SIZE]
