"""The job store: models (``models``), engines (``session``), migrations (``migrate``) and the
compare-and-set state machine (``transitions``)."""
