"""What users read, on models whose names are hostile or odd: ONNX node, tensor, input and
output names are free text (newlines, quotes, HTML, ``$``, the ``.alls`` syntax characters
``# { } ( ) , =``). Every file written from them must stay what it claims to be: a Hailo
script whose lines are only the lines quantscope wrote, Python that compiles, a report
that renders. Each model is built here, a few nodes."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.export.alls_lint import parse_alls
from quantscope.export.hailo_alls import export_alls, unset_decisions, unset_group
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.types import Plan, Precision

# a name that, written raw into a comment, would start a line the compiler runs
INJECT = "conv\nquantization_param({*}, precision_mode=a16_w16)"
ALLS_SYNTAX = "c2 # {x}, y=(z)\r\u2028'\"\\"


def conv_chain(first: str, second: str, gemm: str, *, tensor: str = "t1", inp: str = "x",
               out: str = "y", weight: str = "w1") -> onnx.ModelProto:
    """Conv-Relu-Conv-Relu-GlobalAveragePool-Flatten-Gemm with the given node names, the
    first Conv's output tensor named ``tensor`` and its weight ``weight``, input ``inp``
    and output ``out``."""
    r = np.random.default_rng(0)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(r.normal(0, 0.3, shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", [inp, weight, "b1"], [tensor], name=first, pads=[1, 1, 1, 1]),
        helper.make_node("Relu", [tensor], ["t2"], name="r1"),
        helper.make_node("Conv", ["t2", "w2", "b2"], ["t3"], name=second, pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["t3"], ["t4"], name="r2"),
        helper.make_node("GlobalAveragePool", ["t4"], ["t5"], name="p"),
        helper.make_node("Flatten", ["t5"], ["t6"], name="f"),
        helper.make_node("Gemm", ["t6", "w3", "b3"], [out], name=gemm, transB=1),
    ]
    graph = helper.make_graph(
        nodes, "hostile", [helper.make_tensor_value_info(inp, TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", 8])],
        [w(weight, 8, 3, 3, 3), w("b1", 8), w("w2", 8, 8, 3, 3), w("b2", 8), w("w3", 8, 8),
         w("b3", 8)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_alls_comments_hold_any_name_on_one_line():
    """A group name with a newline used to be written raw into the script's ``#`` comments:
    its second line (``quantization_param({*}, precision_mode=a16_w16)``) became a command
    the compiler would run, and lint found broken lines. Now each script line is one line
    whatever the names hold, and the script parses back to exactly the commands written."""
    model = load_proto(conv_chain(INJECT, ALLS_SYNTAX, "g\r\nallocator_param(x)"))
    groups = find_groups(model)
    plan = Plan(default=Precision.A8_W8, target="hailo8",
                overrides=((INJECT, Precision.A16_W8), (ALLS_SYNTAX, Precision.A16_W16)),
                reasons=((INJECT, "why\nquantization_param(conv2, precision_mode=a8_w8)"),))
    text = export_alls(plan, groups, force_ranges={"g\r\nallocator_param(x)": (-1.0, 1.0)})
    commands, problems = parse_alls(text)
    assert problems == []
    assert [c.text for c in commands] == [
        "quantization_param(conv1, precision_mode=a16_w8)",
        "quantization_param(conv2, precision_mode=a16_w16)",
        "quantization_param(fc1, force_range_out=[-1.0, 1.0])"]
    assert "# guessed name: conv1 for ONNX 'conv\\nquantization_param({*}, " in text
    assert "c2 # {x}, y=(z)\\r\\u2028'\"\\" in text  # said, escaped, on its comment line


def test_alls_says_an_exact_layer_name_it_cannot_write():
    """An HN layer name that a script line cannot hold (a comma, a parenthesis) is not
    written into a broken command: the decision is a NOT SET comment that says why."""
    model = load_proto(conv_chain("c1", "c2", "g"))
    groups = find_groups(model)
    plan = Plan(default=Precision.A8_W8, target="hailo8",
                overrides=(("c1", Precision.A16_W8), ("c2", Precision.A16_W8)))
    text = export_alls(plan, groups, layer_names={"c1": "conv(1), x=2", "c2": "net/conv2"})
    commands, problems = parse_alls(text)
    assert problems == []
    assert [c.text for c in commands] == ["quantization_param(net/conv2, precision_mode=a16_w8)"]
    assert unset_decisions(text) == [
        "c1: a16_w8 NOT SET: its Hailo layer name 'conv(1), x=2' cannot be written in a "
        "script line (only letters, digits and _ . / - can): set it by hand"]


def test_a_name_holding_not_set_is_no_unset_decision():
    """Node names holding the words "NOT SET" (a guessed-name comment and a reason comment
    say them) were counted as decisions the script does not carry: ``export`` and the
    verdict warned "2 plan decision(s) NOT SET" on a script that carries every one. The
    count reads the decision line's structure; a real unset decision is still counted."""
    from quantscope.report.summary import unset_line

    first, second = "c1 NOT SET", "c2: a16_w16 NOT SET: x"
    model = load_proto(conv_chain(first, second, "g"))
    plan = Plan(default=Precision.A8_W8, target="hailo8",
                overrides=((first, Precision.A16_W8), (second, Precision.A16_W16)),
                reasons=((first, "kept NOT SET by nobody"),))
    text = export_alls(plan, find_groups(model))
    assert unset_decisions(text) == []  # the verdict's export_warnings and lint read these
    assert unset_line([f"m.alls: {ln}" for ln in unset_decisions(text)]) is None
    # the same names with the second conv's HN name unwritable: one decision is unset
    text = export_alls(plan, find_groups(model), layer_names={second: "conv(2)"})
    assert len(unset_decisions(text)) == 1
    assert unset_group(unset_decisions(text)[0]) == second  # lint names it whole
    line = unset_line([f"m.alls: {ln}" for ln in unset_decisions(text)])
    assert line is not None and line.startswith(
        "warning: 1 plan decision(s) NOT SET in the compiler file (m.alls: 1)"), line


def _io_row(role: str, tensor: str, scale: float, zp: int) -> dict:
    return {"role": role, "tensor": tensor, "bits": 8, "signed": False, "stored_type": "uint8",
            "q_min": 0, "q_max": 255, "scale": scale, "zero_point": zp, "min": -zp * scale,
            "max": (255 - zp) * scale}


def test_io_snippet_compiles_and_keeps_one_function_per_tensor():
    """``io_snippet.py`` wrote each tensor name raw into a comment (a newline in an output
    name ended the comment: the file did not compile) and made function names by replacing
    characters, so inputs ``a/b`` and ``a.b`` both became ``to_device_a_b``: the second
    silently replaced the first. Now the snippet compiles for any names, each tensor has its
    own function, and each one computes its own tensor's codes."""
    from quantscope.export.device_io import python_snippet

    lookup = {"table": 'emb"""\n\\', "shape": [10, 4], "dtype": "float32", "megabytes": 0.0,
              "indices": "ids\nx", "output": "a/b", "node": "gather\n)"}
    rows = [{**_io_row("input", "a/b", 0.5, 10), "host_lookup": lookup},
            _io_row("input", "a.b", 0.25, 20), _io_row("input", "x²\u2028y", 0.1, 0),
            _io_row("output", 'out<script>\n"q"\\,=#', 0.125, 3)]
    text = python_snippet(rows)
    ns: dict = {}
    exec(compile(text, "io_snippet.py", "exec"), ns)  # noqa: S102 - the generated code
    one = np.array([1.0], np.float32)
    assert ns["to_device_a_b"](one)[0] == 12 and ns["to_device_a_b_2"](one)[0] == 24
    assert ns["to_device_x__y"](one)[0] == 10
    assert ns["from_device_out_script___q"](np.array([11]))[0] == 1.0
    assert "lookup_a_b" in ns and "load_table_a_b" in ns
    assert "# out<script>\\n\"q\"\\,=#: uint8" in text  # the name said, on its line


def test_report_draws_names_that_look_like_tex(tmp_path, capsys):
    """A node named ``a$x^{$b`` reached a figure's labels, matplotlib parsed it as mathtext
    and ``run`` stopped at the report stage with ``internal error: ValueError: x^{``; a
    carriage return in a name printed a font warning on the console. Now labels are plain
    text: the run completes, its report is written, and the console has no warning."""
    from quantscope.cli import main

    onnx.save(conv_chain("a$x^{$b", "c$\\frac{$d", "g\r$e$"), tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(0).normal(0, 1, (16, 3, 8, 8))
             .astype(np.float32))
    capsys.readouterr()
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--target", "hailo8", "--finetune", "off", "--out", str(tmp_path / "W")]) == 0
    err = capsys.readouterr().err
    assert "Warning" not in err and "internal error" not in err, err
    assert "a$x^{$b" in (tmp_path / "W" / "report.html").read_text()


def _mlp(extra: list, outputs: list, inits: list, name: str = "odd") -> onnx.ModelProto:
    """``x [N, 8]`` -> MatMul -> Relu -> MatMul = ``y``, then ``extra`` nodes."""
    r = np.random.default_rng(2)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["a"], name="relu1"),
             helper.make_node("MatMul", ["a", "w2"], ["y"], name="mm2"), *extra]
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        outputs, [numpy_helper.from_array(r.normal(0, .5, (8, 16)).astype(np.float32), "w1"),
                  numpy_helper.from_array(r.normal(0, .5, (16, 8)).astype(np.float32), "w2"),
                  *inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _refused_run(tmp_path, model: onnx.ModelProto, capsys) -> str:
    """``run`` on ``model`` (saved as m.onnx) with 16 random samples of ``x``, into
    ``tmp_path / 'W'``: exit 2; its last line."""
    from quantscope.cli import main

    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(0).normal(0, 1, (16, 8))
             .astype(np.float32))
    capsys.readouterr()
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--target", "hailo8", "--out", str(tmp_path / "W")]) == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_an_output_with_no_values_is_refused_in_one_line(tmp_path, capsys):
    """An output of shape ``[N, 0]`` (a Slice to nothing) went through analysis and then
    stopped ``run`` in the plan's repairs with ``internal error: ValueError: zero-size
    array to reduction operation maximum``, a run folder half written. Now the model is
    refused on load, one line naming the output and the fix, and no folder is made."""

    ints = [numpy_helper.from_array(np.array([v], np.int64), n)
            for n, v in (("s0", 0), ("s1", 0), ("ax", 1))]
    model = _mlp([helper.make_node("Slice", ["y", "s0", "s1", "ax"], ["empty"], name="cut")],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8]),
                  helper.make_tensor_value_info("empty", TensorProto.FLOAT, ["N", 0])], ints)
    assert _refused_run(tmp_path, model, capsys) == (
        f"quantscope: error: model '{tmp_path / 'm.onnx'}' output 'empty' has shape [N, 0]: no "
        "value for any sample to measure; remove it from the graph's outputs and re-export")
    assert not (tmp_path / "W").exists()


def test_an_output_fp32_makes_inf_on_some_samples_is_named(tmp_path, capsys):
    """``1 / x`` on data where 3 of 16 samples are 0: FP32's own output is inf there.
    ``calibrate`` left those values out of the range and said nothing (its stats, and the
    encodings exported from them, looked whole); ``run`` stopped later with 'reference: 3
    of 16 rows contain NaN/inf', naming no output. Now the first FP32 run refuses in one
    line naming the output, before any file is written."""
    from quantscope.cli import main

    model = _mlp([helper.make_node("Div", ["one", "x"], ["inv"], name="div")],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8]),
                  helper.make_tensor_value_info("inv", TensorProto.FLOAT, ["N", 8])],
                 [numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    onnx.save(model, tmp_path / "m.onnx")
    x = np.random.default_rng(0).normal(0, 1, (16, 8)).astype(np.float32)
    x[:3] = 0.0
    np.savez(tmp_path / "x.npz", x=x)
    line = ("quantscope: error: FP32 output 'inv' (24 values) is NaN or inf on the calibration "
            "data (the model itself, before any quantization): nothing to compare a quantized "
            "output with; drop the samples it breaks on from the data, or fix the model")
    capsys.readouterr()
    assert main(["calibrate", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--out", str(tmp_path / "s.npz")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == line
    assert not (tmp_path / "s.npz").exists()
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--target", "qnn_htp_v73", "--out", str(tmp_path / "W")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # the fit split's values
    assert last.startswith("quantscope: error: FP32 output 'inv' (") and line[-60:] in last
    assert not (tmp_path / "W").exists()


def test_an_output_fp32_gives_the_same_on_every_sample_is_said(tmp_path, capsys):
    """An output that does not depend on the input (``y * 0 + c``). As the only output it
    stopped ``run`` with "'score_db' in offender 'mm1' of analysis '…/analysis.json' must be
    a number (got 'nan')": the run could not read its own file and named no cause. Beside
    another output it was scored (SQNR +inf, cosine 1) without a word. Now the first is
    refused in one line before any file is written, the second is a warning of the verdict
    (console, verdict.json) and a note of evaluate.json."""
    from quantscope.cli import main
    from quantscope.serde import read_json

    const = [helper.make_node("Mul", ["y", "zero"], ["yz"], name="mulz"),
             helper.make_node("Add", ["yz", "c"], ["const"], name="addc")]
    inits = [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.full(8, 0.3, np.float32), "c")]
    vi = helper.make_tensor_value_info
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(0).normal(0, 1, (16, 8))
             .astype(np.float32))
    onnx.save(_mlp(const, [vi("const", TensorProto.FLOAT, ["N", 8])], inits), tmp_path / "c.onnx")
    onnx.save(_mlp(const, [vi("y", TensorProto.FLOAT, ["N", 8]),
                           vi("const", TensorProto.FLOAT, ["N", 8])], inits), tmp_path / "m.onnx")
    capsys.readouterr()
    assert main(["run", str(tmp_path / "c.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--target", "hailo8", "--out", str(tmp_path / "C")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"quantscope: error: every output of model '{tmp_path / 'c.onnx'}' ('const') is the "
        "same on every sample of the calibration data: FP32 does not depend on the input "
        "there, so no quantization error can be measured; check the model's outputs and the "
        "data")
    assert not (tmp_path / "C").exists()
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--target", "hailo8", "--finetune", "off", "--out", str(tmp_path / "W")]) == 0
    note = ("output 'const' is the same on every sample in FP32 (it does not depend on the "
            "input on this data): what it scores says little about the quantized model")
    assert f"  warning: {note}" in capsys.readouterr().out
    assert note in read_json(tmp_path / "W" / "verdict.json", "verdict")["says_little"]
    assert note in read_json(tmp_path / "W" / "evaluate.json", "result")["results"]["plan"]["notes"]


def test_an_output_range_the_held_out_data_exceeds_is_a_warning(tmp_path, capsys):
    """Held-out samples three times wider than the fit samples: the output's calibrated
    range clips them, the device would return capped values. ``evaluate.json`` counted it,
    but ``run``'s verdict (console, verdict.json, report) said nothing of it. Now each
    clipping output is a ``warning:`` line naming it, its range and FP32's."""
    from quantscope.cli import main
    from quantscope.serde import read_json

    onnx.save(_mlp([], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], []),
              tmp_path / "m.onnx")
    x = np.random.default_rng(0).normal(0, 1, (16, 8)).astype(np.float32)
    x[8:] *= 3.0  # the held-out half (run fits on the first half)
    np.savez(tmp_path / "x.npz", x=x)
    capsys.readouterr()
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--target", "qnn_htp_v73", "--finetune", "off", "--out",
                 str(tmp_path / "W")]) == 0
    out = capsys.readouterr().out
    said = read_json(tmp_path / "W" / "verdict.json", "verdict")["saturated_outputs"]
    assert len(said) == 1 and said[0].startswith("output 'y' clips "), said
    assert "of its held-out values at its calibrated range" in said[0]
    assert f"  warning: {said[0]}" in out
    assert said[0].replace("'", "&#x27;") in (tmp_path / "W" / "report.html").read_text()


def test_the_verdict_keeps_one_line_per_item_whatever_the_names(tmp_path, capsys):
    """An output named ``out\\n"q"`` split the verdict's ``compile:`` line in two on the
    console (and in the report's verdict): the second half read as a line of its own. Now each verdict line is one line, the name's newline written ``\\n``."""
    from quantscope.cli import main

    onnx.save(conv_chain("c1", "c2", "g", out='out\n"q"'), tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(0).normal(0, 1, (16, 3, 8, 8))
             .astype(np.float32))
    capsys.readouterr()
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--target", "hailo8", "--finetune", "off", "--out", str(tmp_path / "W")]) == 0
    out = capsys.readouterr().out.splitlines()
    verdict = out[next(i for i, ln in enumerate(out) if ln.startswith("verdict:")):]
    assert all(ln.startswith(("verdict:", "  ", "stages run:")) for ln in verdict), verdict
    assert any('output out\\n"q" uint' in ln for ln in verdict), verdict


def test_a_model_name_the_qdq_graph_also_gives_is_named(tmp_path, capsys):
    """A model with an input ``x`` and a tensor of its own named ``x_dq`` (the name the
    Q/DQ graph gives the dequantized input): ``run`` stopped with "ONNX Runtime cannot run
    this model (… Duplicate definition of name (x_dq)): check that every op is supported
    by onnxruntime", blaming the ops. Now one line names the tensor and the fix."""

    bias = numpy_helper.from_array(np.ones(8, np.float32), "x_dq")
    model = _mlp([helper.make_node("Add", ["y", "x_dq"], ["z"], name="add")],
                 [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 8])], [bias])
    assert _refused_run(tmp_path, model, capsys) == (
        "quantscope: error: the model names a tensor 'x_dq', a name the Q/DQ graph gives one "
        "of its own (it adds _dq, _float, _quantized, _scale, _zero_point to a quantized "
        "tensor's name): rename that tensor in the model and re-export")


def test_calibration_samples_all_alike_are_not_blamed_on_the_model(tmp_path, capsys):
    """Data whose samples are all the same (zeros, one sample repeated) makes every output
    the same on every sample too, but the model does depend on its input: calibrate is not
    refused as "FP32 does not depend on the input" (the analysis notes an all-zero
    calibration); the refusal is for a model whose outputs stay put while its input moves."""
    from quantscope.cli import main

    vi = helper.make_tensor_value_info
    onnx.save(_mlp([], [vi("y", TensorProto.FLOAT, ["N", 8])], []), tmp_path / "m.onnx")
    np.save(tmp_path / "z.npy", np.zeros((6, 8), np.float32))
    assert main(["calibrate", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "z.npy"),
                 "--out", str(tmp_path / "s.npz")]) == 0
    assert "does not depend on the input" not in capsys.readouterr().err
