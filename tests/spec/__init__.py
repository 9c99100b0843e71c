"""An executable specification of docs/views.md (``views``), the grammar of hostile logs the
property-based differential test draws (``logs``), and the harness that reads the real
implementations' views in the same shape (``harness``)."""
