"""Geometric means of SLAB over SLUB of the same release from a ``slab_vs_slub`` sweep run.

Usage: ``python scripts/slab_vs_slub_means.py RUN_DIR`` (the directory ``sweep run`` made,
or the ``--out`` directory holding it).  Pairs each ``slab-vX`` row with the ``vX`` row of
the same CPUs, cache and workload and prints memory per release and ns per op per CPU count
(docs/SPECS.md quotes them)."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl

KEYS = ["rel", "cpus", "cache", "workload"]


def main(run: str) -> None:
    parts = sorted(Path(run).glob("**/part-*.parquet"))
    if not parts:
        sys.exit(f"{run}: no part-*.parquet under it")
    df = pl.read_parquet(parts).with_columns(
        pl.col("profile", "cache", "workload").cast(pl.String))
    df = df.with_columns(slab=pl.col("profile").str.starts_with("slab-"),
                         rel=pl.col("profile").str.replace("slab-", ""))
    cols = KEYS + ["memory_bytes", "total_ns_per_op"]
    j = df.filter(pl.col("slab")).select(cols).join(
        df.filter(~pl.col("slab")).select(cols), on=KEYS, suffix="_slub")
    j = j.with_columns(
        mem=(pl.col("memory_bytes") / pl.col("memory_bytes_slub")).log(),
        t=(pl.col("total_ns_per_op") / pl.col("total_ns_per_op_slub")).log())
    print("memory, SLAB / SLUB:")
    print(j.group_by("rel").agg(pl.col("mem").mean().exp().round(2)).sort("rel"))
    print("ns per op, SLAB / SLUB:")
    with pl.Config(tbl_rows=40):
        print(j.group_by(["rel", "cpus"]).agg(pl.col("t").mean().exp().round(2))
              .pivot(on="rel", index="cpus", values="t").sort("cpus"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs")
