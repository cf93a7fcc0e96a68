"""The kernel snapshot format: one row per slab cache of one boot.

This is the contract ``slabtune kernel snapshot`` writes, ``slabtune kernel check`` reads,
and the guest validator produces from inside a qemu guest.  The first columns are fixed, in
this order; extra columns may follow.
"""

from __future__ import annotations

#: Required columns, in order.  CPU and node columns hold kernel list syntax ("0-63", "0,2").
SNAPSHOT_COLUMNS: tuple[str, ...] = (
    "kernel_release",
    "cmdline",
    "cpus_possible",
    "cpus_present",
    "cpus_online",
    "nodes_with_memory",
    "nodes_with_cpu",
    "cache",
    "object_size",
    "slab_size",
    "order",
    "objs_per_slab",
    "min_partial",
    "cpu_partial",
    "sheaf_capacity",
)
#: Columns that identify one boot within a snapshot.
BOOT_COLUMNS: tuple[str, ...] = SNAPSHOT_COLUMNS[:7]
