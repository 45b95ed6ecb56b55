"""The ``photos`` view-retrieval task: frozen views of packaged photos, its metrics."""

import importlib.metadata

import numpy as np
import pytest

from quantscope.tasks.images import (
    SKIMAGE_PHOTOS,
    ViewRetrievalTask,
    make_views,
    nearest_other,
    views_digest,
)
from quantscope.types import Outputs


def _has_photos() -> bool:
    try:
        importlib.metadata.version("scikit-image")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_photos = pytest.mark.skipif(not _has_photos(),
                                  reason="scikit-image (extra 'models') is not installed")


@needs_photos
def test_views_are_seeded_224_rgb_and_differ_per_view():
    a, b = make_views(views=2, photos=3), make_views(views=2, photos=3)
    assert a.views.shape == (6, 224, 224, 3) and a.views.dtype == np.uint8
    assert views_digest(a.views) == views_digest(b.views)  # frozen by the seed
    assert a.photo.tolist() == [0, 0, 1, 1, 2, 2]
    assert a.photo_names[0] == next(iter(SKIMAGE_PHOTOS))
    assert not np.array_equal(a.views[0], a.views[1])  # two different views of one photo
    other = make_views(views=2, photos=3, seed=1)
    assert views_digest(other.views) != views_digest(a.views)
    assert "SHA-256 checked" in a.provenance


@needs_photos
def test_face_chips_are_photos_too():
    v = make_views(views=1)
    assert len(v.photo_names) == len(SKIMAGE_PHOTOS) + 18
    assert v.photo_names[-1].startswith("faces/")


def test_nearest_other_never_returns_itself():
    emb = np.array([[1.0, 0], [0.9, 0.1], [0, 1], [0.1, 1]])
    assert nearest_other(emb).tolist() == [1, 0, 3, 2]


def _outputs(x: np.ndarray) -> Outputs:
    return Outputs(names=("tokens",), batches=((x[:3],), (x[3:],)))


def test_metrics_identical_then_scrambled():
    rng = np.random.default_rng(0)
    photo = np.repeat(np.arange(3, dtype=np.int32), 2)
    centers = rng.normal(0, 1, (3, 5, 8))
    tokens = centers[photo] + rng.normal(0, 0.05, (6, 5, 8))  # [B, T, C]: CLS = token 0
    task = ViewRetrievalTask(name="t", photo=photo)
    same = task.metrics(_outputs(tokens), _outputs(tokens)).values
    assert same["recall@1"] == same["recall@1_fp32"] == 1.0
    assert same["top1_agreement"] == 1.0 and same["embedding_cosine_mean"] == pytest.approx(1.0)
    noisy = tokens.copy()
    noisy[:, 0] = rng.normal(0, 1, (6, 8))  # the CLS tokens lose the photo
    bad = task.metrics(_outputs(tokens), _outputs(noisy)).values
    assert bad["recall@1"] < 1.0 and bad["top1_agreement"] < 1.0
    assert bad["recall@1_patch_mean"] == 1.0  # the patch-mean variant is untouched
    assert bad["embedding_sqnr_db"] < same["embedding_sqnr_db"]


def test_photos_on_a_model_that_is_not_224_rgb_is_one_clear_error():
    import tiny_models as tm

    from quantscope.model.load import load_proto
    from quantscope.tasks.registry import open_task_data
    from quantscope.types import QuantscopeError

    with pytest.raises(QuantscopeError, match=r"224x224 RGB images .* \[B, 3, 224, 224\]"):
        open_task_data("photos", load_proto(tm.conv_net()))


@needs_photos
def test_photos_small_is_every_third_photo():
    small, full = make_views(views=1, step=3), make_views(views=1)
    assert small.photo_names == full.photo_names[::3] and len(small.photo_names) == 12
