"""Lambda's batch layer: every view recomputed set-wise from the Delta archive up to a log position.

- :mod:`.definition`: the views as pure ``DataFrame -> DataFrame`` set functions (docs/views.md);
- :mod:`.job`: archive up to P -> Delta tables in their own namespace, P in the commit metadata
  (``python -m pipelines.batch_layer``, the ``batch_layer`` DAG);
- :mod:`.cross_check`: the live keyed state in Redis against the batch views at the same P.
"""
