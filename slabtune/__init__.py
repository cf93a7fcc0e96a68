"""slabtune: sweep and tune Linux SLUB slab policies with a vectorised JAX model."""

__version__ = "0.1.0"
