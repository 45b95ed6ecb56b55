"""Graph rewrites (token split, head split, row scaling, output scaling, channel
peeling, and a decoder's residual rotation, gated-product smoothing and prefill MLP
split): one registry (:data:`quantscope.rewrites.registry.REWRITES`), one entry type
(:class:`quantscope.rewrites.base.Rewrite`) and one runner
(:func:`quantscope.rewrites.base.run_rewrite`) that checks each one's FP32 function; a
decoder's pair of phase graphs through :func:`quantscope.rewrites.phases.on_phases`.

The graph edits themselves live in :mod:`quantscope.repair` (``tokens``, ``heads``,
``rowscale``, ``outscale``, ``peel``, ``rotate``, ``smooth``, ``gated``); a module here
binds one of them to the registry. This face imports nothing: import the submodules.
"""
