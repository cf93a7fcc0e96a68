"""The model against the real allocator at the fleet's live sets (issue 32, item 3): the
lab configs ``examples/lab/*-1k-*.toml`` keep 1,024 or more objects per CPU
(``drain = "hold"``: model/workloads.py hold_levels on the model's side, the lab module's
``drain=hold`` on the kernel's), booted on 6.1, 6.12 and 7.2 in lockstep over the counted
window, which ends before the drain (``end_park``).  Their measured rows are in
tests/data/lab-1k-*.csv; each is held to the issue's targets: memory within 10%, the
allocation and free fast paths within 5 points, new slabs per 1000 ops within 30%.  A row
that misses one is an xfail carrying the measured reason (the row's ``miss`` column),
never a wider tolerance."""

from __future__ import annotations

import csv
import tomllib
from pathlib import Path

import pytest

from slabtune.validate import lab

ROOT = Path(__file__).resolve().parent.parent
DATA = sorted((Path(__file__).resolve().parent / "data").glob("lab-1k-*.csv"))

#: The issue's targets: |predicted - measured| in points of the fast-path fractions,
#: relative to the measurement for memory and new slabs per kop.
FAST_POINTS = 0.05
MEMORY_REL = 0.10
CHURN_REL = 0.30

#: The lab kernels every config was booted on.
KERNELS = ("6.1", "6.12", "7.2")


def _rows():
    out = []
    for path in DATA:
        with open(path, newline="") as f:
            for r in csv.DictReader(line for line in f if not line.startswith("#")):
                out.append(r)
    return out


ROWS = _rows()


@pytest.fixture(scope="module")
def predictions():
    """Every row's prediction in one model call (the configs as stored, each under the
    profile of the kernel it was booted on, lockstep, the counted window)."""
    items = []
    for r in ROWS:
        doc = tomllib.loads((ROOT / "examples" / "lab" / f"{r['config']}.toml").read_text())
        items.append((doc, lab.release_profile(r["release"])))
    preds = lab.predict(items, lockstep=[True] * len(items))
    return {(r["kernel"], r["config"]): p for r, p in zip(ROWS, preds)}


def _params():
    out = []
    for r in ROWS:
        marks = [pytest.mark.xfail(reason=r["miss"], strict=True)] if r.get("miss") else []
        out.append(pytest.param(r, id=f"{r['kernel']}-{r['config']}", marks=marks))
    return out


def test_the_rows_cover_every_kind_and_kernel_at_1024_live_per_cpu():
    """Six configs or more, local, producer/consumer and request/response, each on every
    lab kernel; each keeps at least 1,024 objects per CPU by its declaration."""
    configs = {r["config"] for r in ROWS}
    assert len(configs) >= 6
    for name in configs:
        doc = tomllib.loads((ROOT / "examples" / "lab" / f"{name}.toml").read_text())
        wl, cpus = doc["workload"], doc["topology"]["cpus"]
        assert wl.get("drain", "hold") == "hold"
        if wl["kind"] == "producer_consumer":
            senders = sum((c + 1) // 2 for c in _node_cpus(doc["topology"]))
            assert wl["depth"] * senders >= 1024 * cpus, name
        else:
            assert wl["live"] >= 1024, name
        assert {r["kernel"] for r in ROWS if r["config"] == name} == set(KERNELS), name
    assert {tomllib.loads((ROOT / "examples" / "lab" / f"{n}.toml").read_text())
            ["workload"]["kind"] for n in configs} >= {"local", "producer_consumer",
                                                      "request_response"}


def _node_cpus(topo) -> list[int]:
    n = topo.get("nodes", 1)
    base, extra = divmod(topo["cpus"], n)
    return topo.get("node_cpus") or [base + (1 if i < extra else 0) for i in range(n)]


@pytest.mark.parametrize("row", _params())
def test_the_model_meets_the_kernel_at_the_fleets_live_sets(row, predictions):
    """Memory within 10%, fast paths within 5 points, new slabs per kop within 30% (a
    measured 0 is met only by a predicted 0)."""
    p = predictions[(row["kernel"], row["config"])]
    m = {k: float(row[k]) for k in lab.COMPARED}
    misses = []
    if abs(p["memory_bytes"] / m["memory_bytes"] - 1) > MEMORY_REL:
        misses.append(("memory_bytes", p["memory_bytes"], m["memory_bytes"]))
    for k in ("alloc_fastpath_frac", "free_fastpath_frac"):
        if abs(p[k] - m[k]) > FAST_POINTS:
            misses.append((k, p[k], m[k]))
    pc, mc = p["slab_allocs_per_kop"], m["slab_allocs_per_kop"]
    if pc != mc and (mc == 0 or abs(pc / mc - 1) > CHURN_REL):
        misses.append(("slab_allocs_per_kop", pc, mc))
    assert not misses, misses
