"""slabtune.results: the results store (parquet parts + manifest), queries and charts.

The store's API is re-exported lazily so that importing a light submodule (e.g.
``slabtune.kernel.snapshot``) does not import polars::

    from slabtune.results import open_run
    lf = open_run("runs/quick-...").scan()      # a polars LazyFrame
"""

_STORE_EXPORTS = ("open_run", "resolve_run", "list_runs", "iter_runs", "create_run", "Run",
                  "StoreError")


def __getattr__(name):
    if name in _STORE_EXPORTS:
        from slabtune.results import store

        return getattr(store, name)
    raise AttributeError(f"module 'slabtune.results' has no attribute {name!r}")


__all__ = list(_STORE_EXPORTS)
