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
