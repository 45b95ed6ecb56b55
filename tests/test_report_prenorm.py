"""The pre_norm match-rate plot appears when face results carry it (field report 002)."""

from quantscope.report import report_html


def _result(rates, gate):
    table = {}
    for (lo, hi), r in zip([(0, 5), (5, 10), (10, 15)], rates, strict=True):
        table[f"{lo}..{hi}"], table[f"{lo}..{hi} n"] = r, 8.0
    return {"metrics": {"tar@far0.01": 0.9, "pre_norm_gate": gate},
            "outputs": {"pre_norm_match_rate": table}}


def test_prenorm_section_plots_each_configuration():
    page = report_html("faces", results={"fp32": _result([0.8, 1.0, 1.0], 4.0),
                                         "a8_w8": _result([0.0, 0.9, 1.0], 9.0)})
    assert "Match rate by embedding pre_norm" in page
    assert page.count("data:image/png;base64,") >= 2  # the configs chart and this plot


def test_no_prenorm_section_without_the_table():
    page = report_html("text", results={"fp32": {"metrics": {"top1_agreement": 1.0}}})
    assert "pre_norm" not in page
