"""Lint of user .alls scripts: the three walls of seeds/000 and the script that compiled.

The four fixture scripts under ``fixtures/alls/`` reproduce the transformer field report
(paraphrase-multilingual-MiniLM-L12-v2 on Hailo-10H, DFC 5.3.0) on the installed
paraphrase-MiniLM-L3-v2 (same layer types, 3 layers, hidden 384); sequence length 256
is supplied as a shape because the model's dims are symbolic.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_models

from quantscope.export.alls_lint import layer_patterns, lint, parse_alls
from quantscope.model.groups import find_groups
from quantscope.model.load import load, load_proto
from quantscope.model.shapes import seq_len_shapes
from quantscope.targets import load_target
from quantscope.types import GroupKind, QuantscopeError
from quantscope.zoo.text import find_minilm_l3_onnx

FIXTURES = Path(__file__).parent / "fixtures" / "alls"
HAILO = load_target("hailo10h")


def _minilm_path():
    """The shipped ONNX of the `models` extra (a test dependency), looked up when a test
    needs it: without the extra only the real-model tests skip, not the whole file."""
    try:
        return find_minilm_l3_onnx()
    except QuantscopeError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def minilm():
    model = load(_minilm_path())
    return model, find_groups(model), seq_len_shapes(model, 256)


def _lint(name, minilm, **kw):
    model, groups, seq = minilm
    kw.setdefault("shapes", seq)
    return lint((FIXTURES / name).read_text(), model, groups, HAILO, **kw)


def _walls(problems):
    return [p for p in problems if p.severity in ("error", "warning")]


def test_wall1_16_bit_softmax_is_flagged(minilm):
    probs = _walls(_lint("wall1_softmax_a16.alls", minilm))
    crash = [p for p in probs if p.rule == "hailo.attention_16bit"]
    assert len(crash) == 3 and all(p.severity == "error" for p in crash)
    assert all(p.reason.startswith("line 2 `quantization_param({softmax1") for p in crash)
    assert "BackendAllocatorException" in crash[0].reason


def test_wall2_a16_w8_on_convs_is_flagged(minilm):
    probs = _walls(_lint("wall2_convs_a16_w8.alls", minilm))
    assert {p.rule for p in probs} == {"hailo.a16_low_sublayer_empty"}
    assert len(probs) == 18  # every conv (= linear) of MiniLM-L3
    assert "exponent [[nan]]" in probs[0].reason and "a16_w16" in probs[0].fix


def test_wall3_16_bit_normalization_at_seq_256_is_flagged(minilm):
    probs = _walls(_lint("wall3_norm_a16.alls", minilm))
    assert {(p.rule, p.severity) for p in probs} == {("hailo.super_defuse", "error")}
    assert len(probs) == 3
    assert "[256, 384] = 98,304 values" in probs[0].reason and "estimate" in probs[0].reason


def test_wall3_depends_on_the_sequence_length(minilm):
    model, _, _ = minilm
    assert _walls(_lint("wall3_norm_a16.alls", minilm, shapes=seq_len_shapes(model, 128))) == []
    unknown = _walls(_lint("wall3_norm_a16.alls", minilm, shapes=None))
    # an error rule that cannot be evaluated stays an error
    assert {(p.rule, p.severity) for p in unknown} == {("hailo.super_defuse", "error")}
    assert all("could not evaluate" in p.reason for p in unknown)


def test_the_script_that_compiled_passes(minilm):
    model, groups, _ = minilm
    probs = _lint("compiled_ffn_out_a16_w16.alls", minilm)
    assert _walls(probs) == []
    guessed = [p for p in probs if p.rule == "alls.guessed_name"]
    assert len(guessed) == 1 and "conv18" in guessed[0].reason
    last = [g for g in groups.groups if g.kind is GroupKind.WEIGHTED][-1]
    assert guessed[0].group == last.name and last.name.endswith("layer.2/output/dense/MatMul")


def test_hn_gives_exact_names(minilm):
    model, groups, seq = minilm
    ffn = [g for g in groups.groups if g.kind is GroupKind.WEIGHTED][-1]
    soft = next(g for g in groups.groups if g.op_type == "Softmax")
    hn = {
        "layers": {
            "minilm/conv72": {"type": "conv", "original_names": [ffn.name]},
            "minilm/softmax1": {"type": "softmax", "original_names": [soft.name]},
        }
    }
    script = (
        "quantization_param(minilm/conv72, precision_mode=a16_w16)\n"
        "quantization_param(softmax1, precision_mode=a16_w16)\n"
        "quantization_param(conv3, precision_mode=a16_w16)\n"
    )
    probs = lint(script, model, groups, HAILO, hn=hn, shapes=seq)
    assert not [p for p in probs if p.rule == "alls.guessed_name"]
    assert {p.rule for p in probs if p.reason.startswith("line 2")} >= {"hailo.attention_16bit"}
    assert [p.rule for p in probs if p.reason.startswith("line 3")] == ["alls.unknown_layer"]
    assert not [p for p in probs if p.reason.startswith("line 1")]


# ---- parser and non-precision lines (tiny model) ----------------------------------


@pytest.fixture(scope="module")
def block():
    model = load_proto(tiny_models.layernorm_block())
    return model, find_groups(model)


def test_parser_forms():
    text = (
        "# a comment\n"
        "normalization1 = normalization([127.5, 127.5, 127.5], [128.0, 128.0, 128.0])\n"
        "quantization_param({conv1, net/conv2}, precision_mode=a16_w16)  # trailing\n"
        "quantization_param(precision_mode=a16_w16)\n"
        "quantization_param(conv*, force_range_out=[-1.1, 1.1])\n"
        "this is not a command\n"
    )
    commands, problems = parse_alls(text)
    assert [c.command for c in commands] == ["normalization", *["quantization_param"] * 3]
    assert commands[0].lhs == "normalization1"
    assert layer_patterns(commands[1]) == ("conv1", "conv2")
    assert layer_patterns(commands[2]) == ("*",)
    assert layer_patterns(commands[3]) == ("conv*",)
    assert commands[3].keyword("force_range_out") == "[-1.1, 1.1]"
    assert [(p.rule, p.reason[:7]) for p in problems] == [("alls.syntax", "line 6 ")]


def test_line_level_problems(block):
    model, groups = block
    text = (
        "normalization1 = normalization([127.5, 127.5], [128.0])\n"
        "quantization_param(conv1, precision_mode=a32_w32)\n"
        "quantization_param(conv9, precision_mode=a16_w16)\n"
        "quantization_param(conv2, force_range_out=[1.0, -1.0])\n"
        "allocator_param(timeout=100)\n"
        "frobnicate(conv1)\n"
    )
    probs = lint(text, model, groups, HAILO)
    by_line = {p.reason.split("`")[0].strip(): p.rule for p in probs if p.severity != "info"}
    assert by_line == {
        "line 1": "alls.bad_normalization",
        "line 2": "alls.bad_precision",
        "line 3": "alls.unknown_layer",
        "line 4": "alls.bad_range",
        "line 6": "alls.unknown_command",
    }


def test_wildcards_and_later_lines_win(block):
    model, groups = block
    text = (
        "quantization_param(*, precision_mode=a16_w8)\n"
        "quantization_param({conv1, conv2}, precision_mode=a8_w8)\n"
    )
    probs = lint(text, model, groups, HAILO, shapes={"x": (1, 8, 24)})
    assert not [p for p in probs if p.rule == "hailo.a16_low_sublayer_empty"]
    probs = lint("quantization_param(conv*, precision_mode=a16_w8)\n", model, groups, HAILO)
    assert [p.group for p in probs if p.rule == "hailo.a16_low_sublayer_empty"] == [
        "MatMul_1",
        "MatMul_8",
    ]
