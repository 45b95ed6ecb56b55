"""A warning rule binds the rewrites' and repairs' preconditions as the planner blocks it
(h75): on hailo8 / hailo8l ``hailo.attention_16bit`` and ``hailo.super_defuse`` are
warnings, which the planner blocks unless ``--allow-warning`` accepts them; before, the
preconditions read only error rules (headsplit / rowscale never tried there: "refuses no
layer of this model") and tokensplit read every problem, accepted or not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tiny_vit
from test_repair_heads import SEQ as HEAD_SEQ
from test_repair_heads import _encoder as attention_encoder
from test_repair_tokens import SEQ, H
from test_repair_tokens import _encoder as token_encoder

from quantscope import stages
from quantscope.model.load import load_proto
from quantscope.pipeline import auto as pipeline_auto
from quantscope.pipeline.auto import auto_key, binding_repairs
from quantscope.rewrites.auto import AutoChoice, should_try
from quantscope.rewrites.registry import REWRITES
from quantscope.rewrites.tokensplit import fitting_chunk, needed_chunk
from quantscope.targets import load_target
from quantscope.targets.accept import for_run
from quantscope.targets.profile import with_params

ATTENTION = "hailo.attention_16bit"
SIZE = "hailo.super_defuse"


@pytest.mark.parametrize("name", ["hailo8", "hailo8l"])
@pytest.mark.parametrize("rewrite", ["headsplit", "rowscale"])
def test_attention_rewrites_are_tried_where_the_warning_blocks_and_not_where_accepted(
        name, rewrite):
    model, target = load_proto(attention_encoder()), load_target(name)
    rw = REWRITES[rewrite]
    blocked = should_try(rw, model, target, HEAD_SEQ, None)
    assert blocked.holds, blocked.reason
    assert (f"{ATTENTION} (warning, blocked by the planner: accept with --allow-warning "
            f"{ATTENTION}) keeps attention at 8 bit") in blocked.reason
    taken = should_try(rw, model, for_run(target, {ATTENTION}), HEAD_SEQ, None)
    assert not taken.holds
    assert f"{ATTENTION} accepted (--allow-warning): attention may be 16 bit" in taken.reason
    # another warning accepted leaves this one blocking
    assert should_try(rw, model, for_run(target, {SIZE}), HEAD_SEQ, None).holds


def test_attention_rewrites_on_hailo10h_read_its_error_rule_as_before():
    model, target = load_proto(attention_encoder()), load_target("hailo10h")
    got = should_try(REWRITES["headsplit"], model, target, HEAD_SEQ, None)
    assert got.holds and f"{ATTENTION} keeps attention at 8 bit" in got.reason
    assert "warning" not in got.reason


def test_tokensplit_applies_where_the_size_warning_blocks_and_not_where_accepted():
    model = load_proto(token_encoder(), "enc")
    small8 = with_params(load_target("hailo8"), {f"{SIZE}.max_values": SEQ * H})
    rw = REWRITES["tokensplit"]
    blocked = should_try(rw, model, small8, SEQ, None)
    assert blocked.holds, blocked.reason
    assert (f"{SIZE} (warning, blocked by the planner: accept with --allow-warning {SIZE}) "
            f"refuses 16 bit on") in blocked.reason
    accepted = for_run(small8, {SIZE})
    taken = should_try(rw, model, accepted, SEQ, None)
    assert not taken.holds
    assert f"{SIZE} accepted (--allow-warning)" in taken.reason
    # the chunk it picks follows the same judgement: accepted, the whole length passes
    assert needed_chunk(model, small8, SEQ) == SEQ // 2
    assert needed_chunk(model, accepted, SEQ) == SEQ
    assert fitting_chunk(model, small8, SEQ) == SEQ // 2


def _warned_qnn(tmp_path: Path) -> str:
    """qnn-htp-v73 with linearclip_5d a warning (rank4 answers it)."""
    text = (Path(stages.__file__).parents[1] / "targets" / "qnn_htp_v73.toml").read_text()
    head, _, rest = text.partition('id = "qnn.linearclip_5d"')
    assert rest, "the profile names qnn.linearclip_5d"
    rest = rest.replace('severity = "error"', 'severity = "warning"', 1)
    path = tmp_path / "qnn_warned.toml"
    path.write_text((head + 'id = "qnn.linearclip_5d"' + rest)
                    .replace('name = "qnn_htp_v73"', 'name = "qnn_warned"', 1))
    return str(path)


def test_a_repair_binds_on_a_warning_the_run_does_not_accept(tmp_path):
    vit = load_proto(tiny_vit.vit_block())
    target = load_target(_warned_qnn(tmp_path))
    assert next(r for r in target.rules if r.id == "qnn.linearclip_5d").severity == "warning"
    blocked = binding_repairs(vit, target, seq_len=None)
    assert [(r["name"], r["binds"]) for r in blocked] == [("rank4", True)]
    assert "(warning, blocked by the planner" in blocked[0]["reason"]
    taken = binding_repairs(vit, for_run(target, {"qnn.linearclip_5d"}), seq_len=None)
    assert [(r["name"], r["binds"]) for r in taken] == [("rank4", False)]
    assert "accepted (--allow-warning)" in taken[0]["reason"]


class _Opts:
    model, data, eval_data, tokenizer, prefixes, pairs = "m.onnx", "d.npz", None, \
        "tok.json", None, None
    seq_len, input_shapes, target, method, metric = None, (), "hailo8", "minmax", None
    layout, batch_axes, repair_batches, allow_warnings = (), (), 4, ()
    calib_texts = None


def test_the_choice_key_changes_only_where_a_warning_rule_is_answered():
    """A folder chosen before on hailo10h (the rules its rewrites answer are errors) keeps
    its key; on hailo8 the answered warning rules are keyed, so it chooses again."""
    ten = type("Ten", (_Opts,), {"target": "hailo10h"})
    assert "warnings_bind" not in auto_key(ten, str)
    assert auto_key(_Opts, str)["warnings_bind"] == [ATTENTION, SIZE]


def test_the_run_choice_reads_the_target_with_its_accepted_warnings(tmp_path, monkeypatch):
    """``run --rewrites auto`` gives the selection the run's view of its target: the
    warnings ``--allow-warning`` accepts, none without it."""
    model = load_proto(attention_encoder(), str(tmp_path / "m.onnx"))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz",
             input_ids=rng.integers(100, 1000, (8, HEAD_SEQ)).astype(np.int64),
             attention_mask=np.ones((8, HEAD_SEQ), np.int64))
    seen = []

    def capture(model, target, seq_len, **kw):
        seen.append(target.accepted)
        return AutoChoice(metric="sqnr_db", higher_is_better=True, n=None, unit="fit samples",
                          measured_on="", baseline=None, final=None, trials=()), None

    monkeypatch.setattr(pipeline_auto, "choose_rewrites", capture)
    for asked, want in (((), frozenset()), ((ATTENTION,), frozenset({ATTENTION}))):
        opts = type("O", (_Opts,), {"data": str(tmp_path / "d.npz"), "tokenizer": None,
                                    "seq_len": HEAD_SEQ, "allow_warnings": asked})
        pipeline_auto.choose(opts, model, progress=False)
        assert seen[-1] == want
