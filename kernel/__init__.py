"""slabtune.kernel: everything that talks to a real kernel.

Snapshots of ``/sys/kernel/slab`` (and their CSV/parquet format), the host's CPU and node
layout, ``kernel check`` (every cache of a snapshot against the model), and qemu guest
boots of Debian kernels with their initramfs and console protocol.
"""
