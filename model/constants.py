"""Model constants that the JAX-free layers (sweep and sim-config parsing, result columns)
check input against or name columns by, so they are defined once and importable without
importing JAX."""

#: Longest run of same-kind operations one simulated CPU may do per step (``ops_per_step``,
#: docs/MODEL.md "Runs"): the static bound of the run-length loop in model/dynamics.py; it
#: keeps the systematic-sampling products (cumulative size x run length) inside int32.
MAX_OPS_PER_STEP = 1024

#: Structure fields, in the order of :class:`slabtune.model.policy.Structure` (the sweep's
#: structural columns and ``simulate``'s structure output).
STRUCTURE_FIELDS: tuple[str, ...] = ("nr_cpus", "min_objects", "order", "objs_per_slab",
                                     "leftover", "min_partial", "cpu_partial",
                                     "cpu_partial_slabs", "sheaf_capacity")
