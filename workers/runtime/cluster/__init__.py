"""Mechanism: everything the runtime does to a Ray cluster, behind the one port (``port``)."""
