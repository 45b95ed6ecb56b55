"""What the docs and the ``--help`` texts say, checked against the code they describe."""

import re

from quantscope.cli.options import LAYOUT_HELP
from quantscope.tasks.layout_spec import KINDS


def test_layout_help_names_every_kind_and_key():
    # `--layout prob=map:channel=1` is read (docs/outside-the-zoo.md's table lists it); the
    # --help of every command that takes --layout must say so too
    for kind, keys in KINDS.items():
        assert f"OUTPUT={kind}" in LAYOUT_HELP, kind
        for key in keys:
            assert re.search(rf"OUTPUT={kind}\[:[^\]]*\b{key}=", LAYOUT_HELP), (kind, key)


def test_metric_help_names_the_default_the_code_uses():
    # the code's default for tensor data is TENSOR_HEADLINE (sqnr_db_channel_min); the
    # --help of run, plan and whatif said 'sqnr_db'
    from quantscope.cli.commands import parser
    from quantscope.tasks.headline import TENSOR_HEADLINE

    for name in ("run", "plan", "whatif"):
        sub = parser(full=[name])._subparsers._group_actions[0].choices[name]
        (action,) = [a for a in sub._actions if "--metric" in a.option_strings]
        assert TENSOR_HEADLINE in action.help, name
        assert "score_agreement" in action.help, name


def _untyped(p):
    """The parser with no argument type: option names and counts checked, no file read."""
    for a in p._actions:
        a.type = None
        if isinstance(a.choices, dict):
            for sub in a.choices.values():
                _untyped(sub)
    return p


def test_every_help_example_parses():
    # `quantscope phases --help` showed a `run` example without its required --out
    import contextlib
    import io
    import shlex

    from quantscope.cli.commands import COMMANDS, chosen, parser

    top = parser()
    subs = top._subparsers._group_actions[0].choices
    examples = [m.group(1) for name in COMMANDS
                for m in re.finditer(r"^\s*quantscope (\S.*)$", subs[name].format_help(),
                                     flags=re.M)]
    assert len(examples) >= len(COMMANDS)
    for line in examples:
        words = shlex.split(line)
        name = chosen(words)
        assert name, line
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                _untyped(parser(full=[name])).parse_args(words)
            except SystemExit as e:
                assert not e.code, (line, err.getvalue())


def test_max_legal_help_names_each_targets_promotion():
    # `plan --max-legal` on qnn-htp-v73 writes every group at a16_w8 (the profile's
    # [promotion]); its --help said a16_w16 for every target
    from quantscope.cli.commands import parser
    from quantscope.targets import BUILTIN_TARGETS, load_target

    sub = parser(full=["plan"])._subparsers._group_actions[0].choices["plan"]
    (action,) = [a for a in sub._actions if "--max-legal" in a.option_strings]
    for name in BUILTIN_TARGETS:
        promote = str(load_target(name).promote)
        assert promote in action.help, (name, promote)
    assert "a16_w8 on qnn-htp-v73" in action.help


def _doc_files():
    from pathlib import Path

    root = Path(__file__).parent.parent
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _cells(line: str) -> int:
    return line.strip().replace("\\|", "").strip("|").count("|") + 1


def test_every_docs_table_renders_whole():
    # a blank line inside docs/outside-the-zoo.md's real-model table, rows appended after a
    # paragraph, a cell wrapped onto plain lines (docs/finetune.md) or a '|' in a cell's
    # text (|error|) broke tables on GitHub: rows shown as text, cells shifted
    for path in _doc_files():
        lines = path.read_text().split("\n")
        fenced, header = False, None
        for i, line in enumerate(lines):
            if line.strip().startswith("```"):
                fenced = not fenced
                continue
            if fenced or not line.startswith("|"):
                header = None
                continue
            where = f"{path.name}:{i + 1}"
            if header is None:
                assert i + 1 < len(lines) and re.match(r"^\|\s*:?-{3,}", lines[i + 1]), (
                    f"{where}: a table row with no header row above it")
                header = _cells(line)
            else:
                assert _cells(line) == header, f"{where}: {_cells(line)} cells, header {header}"


def test_run_seq_len_help_says_the_longest_fit_text():
    # run on retrieval pairs without --seq-len plans at the longest fit text (README; the
    # pipeline says 'seq-len: N tokens, the longest fit text'); its --help said 'default:
    # none: the shapes the model declares', which is the other commands' default
    from quantscope.cli.commands import parser

    for name, said in (("run", "the longest fit text"), ("check", "the shapes the model")):
        sub = parser(full=[name])._subparsers._group_actions[0].choices[name]
        (action,) = [a for a in sub._actions if "--seq-len" in a.option_strings]
        assert said in action.help, (name, action.help)
