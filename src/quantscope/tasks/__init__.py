"""Task data and task metrics.

``text``     retrieval pairs, calibration texts, sentence-encoder detection, batching, pooling
``faces``    face verification data
``metrics``  numpy metrics (recall@k, agreement, fidelity, collapse)

Submodules are imported explicitly (``from quantscope.tasks import text``): importing this
package loads none of them.
"""
