"""One request from arrival to reply: `router` (session -> tokens -> workload -> policy ->
nodes -> legs; its records in `turn_state`, its readback steps in `readback_legs`), which
carries out the legs `turn_machine` walks (one turn from its plan to its end, no I/O: the
simulator drives the same machine) of the plan `turn_plan` makes (the policy's verdict and
the nodes that serve it), with `failover` over the nodes of a role.
"""
