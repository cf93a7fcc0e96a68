"""slabtune.validate: candidate policies checked against real allocators.

Candidates come from a study's Pareto front or a file; a validation spec names the
topologies and workloads; each (candidate, topology, target) pair runs as a Ray task against
a qemu guest kernel, this host's kernel or the native allocator, and its rows store the
measurement beside the model's prediction; ``report`` summarises a run.  The method and its
measured figures are in docs/VALIDATION.md.
"""
