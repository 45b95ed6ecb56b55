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
