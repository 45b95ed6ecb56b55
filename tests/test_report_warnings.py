"""The run report's compiler-file warnings: a head-split model's script leaves a NOT SET
line per head and op (158 on minilm-l6), and the report printed every one of them under
the compiler files' table, a page and a half of lines before the first figure. The first
few are shown, the rest folded under one line that counts them."""

from __future__ import annotations

from quantscope.report.run import INLINE_WARNINGS, export_warnings_html


def test_many_warnings_fold_under_a_line_that_counts_them() -> None:
    warnings = [f"model.alls: head{i}/exp: a16_w16 NOT SET" for i in range(INLINE_WARNINGS + 3)]
    page = export_warnings_html(warnings)
    before, _, folded = page.partition("<details>")
    assert before.count("<p class=note>") == INLINE_WARNINGS
    assert f"3 more warnings ({INLINE_WARNINGS + 3} in all; verdict.json lists them)" in folded
    assert all(w in page for w in warnings)  # every one is still there


def test_a_few_warnings_are_shown_as_they_are() -> None:
    page = export_warnings_html(["one", "two"])
    assert page.count("<p class=note>") == 2 and "<details>" not in page
    assert export_warnings_html([]) == ""
