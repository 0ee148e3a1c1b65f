"""Development and test tooling, kept out of the production runtime (``workers.runtime``).

Fault injection (``fault_injector``, ``network_fault_injector``, ``network_faults``,
``delay_line``), local clusters whose nodes declare GPUs (``local_cluster``, and ``netns_cluster``
with one network namespace per node) and the no-failure reference run (``reference_run``).

``orthoplex cluster up`` lives here too: a cluster of declared GPUs on one machine is a development
and demo cluster, not how production runs (there Ray is started by KubeRay or ``ray start``, and the
service connects to it with ``ORTHOPLEX_RAY_ADDRESS``).
"""
