"""The report's log axes are labelled in plain text: with mathtext off (``figures.pyplot``,
so a model's name with ``$`` draws as written) matplotlib's default log labels were drawn
as their raw source, ``$\\mathdefault{10^{2}}$``, on every log-scale plot (the decoder's
candidates, the KV prefix, the buckets' cosine and the headroom plots)."""

from __future__ import annotations

from quantscope.report.figures import log_scale, pyplot


def _labels(axis: str, low: float, high: float) -> list[str]:
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([low, high], [low, high])
    log_scale(ax, axis)
    fig.canvas.draw()
    target = ax.yaxis if axis == "y" else ax.xaxis
    got = [t.get_text() for t in target.get_ticklabels(which="both") if t.get_text()]
    plt.close(fig)
    return got


def test_log_ticks_are_plain_numbers_on_either_axis():
    for axis in ("x", "y"):
        many = _labels(axis, 1.0, 400.0)  # a few decades: the decades labelled
        assert "10" in many and "100" in many, many
        assert not any("$" in t or "mathdefault" in t for t in many), many
        few = _labels(axis, 1.0, 3.0)  # under one decade: the minor ticks labelled too
        assert "2" in few, few
        assert not any("$" in t for t in few), few
