"""The built-in ``fleet_xl`` spec (issue 15 item 4): its size from its axes, a slice of it
against the scalar reference, resume of an interrupted run whose workers wrote parts, and
bad specs.  The full 10^8-row run is benchmarks/bench_sweep.py's, not a test's."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from slabtune import cli
from slabtune.model import caches, profiles, reference
from slabtune.results import store
from slabtune.sweeps import grid, runner
from slabtune.sweeps import spec as sweep_spec
from slabtune.sweeps.dispatch import chunk_task
from slabtune.sweeps.evaluators import structural_columns


def _fls(n: int) -> int:
    return n.bit_length()


@pytest.fixture(scope="module")
def xl():
    return sweep_spec.load("fleet_xl")


def test_axes_are_what_the_spec_promises(xl):
    # every CPU count on either side of a step of fls(nr_cpus), 1..8192
    steps = sorted({n for n in range(1, 8193)
                    if _fls(n) != _fls(n - 1) or (n < 8192 and _fls(n + 1) != _fls(n))})
    assert list(xl.axis("cpus").values) == steps
    assert {_fls(n) for n in steps} == set(range(1, 15))
    assert set(xl.axis("cache").values) == set(caches.CACHES)
    assert set(xl.axis("profile").values) == set(profiles.PROFILES)
    every_order = tuple(range(profiles.MAX_PAGE_ORDER + 1))
    assert xl.axis("min_order").values == xl.axis("max_order").values == every_order
    mo = xl.axis("min_objects").values
    assert mo[0] == 0 and list(mo) == sorted(mo) and mo[-1] == 1024   # the tune knob's top
    # metrics: everything structural but the stride (the cache names it) and min_objects
    # (an axis here)
    assert "min_objects" not in xl.metrics and "order" in xl.metrics


def test_size_is_the_product_of_its_axes_and_about_1e8(xl, capsys):
    lengths = {a.name: len(a) for a in xl.axes}
    want = (len(xl.axis("cpus").values) * len(caches.CACHES) * len(profiles.PROFILES)
            * (profiles.MAX_PAGE_ORDER + 1) ** 2 * lengths["min_objects"])
    assert want == math.prod(lengths.values()) == xl.product == grid.count_rows(xl)
    assert 5 * 10**7 <= want <= 2 * 10**8
    assert cli.main(["sweep", "plan", "fleet_xl"]) == 0
    out = capsys.readouterr().out
    assert f"configs: {want}\n" in out and "est_memory:" in out


def test_min_objects_values_are_every_change_point_on_a_subdomain(xl):
    """Between two listed slub_min_objects values no cache's structure changes: checked
    over 1..1024 for a sample of strides, profiles and order bounds."""
    listed = set(xl.axis("min_objects").values)
    sizes = [8, 104, 192, 584, 2368, 5888]
    profs = ["v2.6.27", "v5.10", "v6.18"]
    bounds = [(0, 3), (0, 10), (2, 10)]
    mo = np.arange(1, 1025, dtype=np.int32)
    n = len(mo)
    cols = {"min_objects": np.tile(mo, len(sizes) * len(profs) * len(bounds))}
    combos = [(s, p, b) for s in sizes for p in profs for b in bounds]
    spec = sweep_spec.parse(f"""
[sweep]
name = "mo"
[topology]
cpus = 64
[cache]
size = {sizes}
[kernel]
profile = {profs}
""")
    cols["size"] = np.repeat([s for s, _, _ in combos], n).astype(np.int32)
    cols["profile"] = np.repeat([profs.index(p) for _, p, _ in combos], n).astype(np.int32)
    cols["min_order"] = np.repeat([b[0] for _, _, b in combos], n).astype(np.int32)
    cols["max_order"] = np.repeat([b[1] for _, _, b in combos], n).astype(np.int32)
    rows = len(cols["size"])
    cols.update(cpus=np.full(rows, 64, np.int32), possible=np.zeros(rows, np.int32),
                explicit_sheaf=np.full(rows, -1, np.int32))
    out = structural_columns(spec, cols)
    key = np.stack([out[f] for f in ("order", "objs_per_slab", "leftover")], -1)
    key = key.reshape(len(combos), n, 3)
    changed = np.any(key[:, 1:] != key[:, :-1], axis=(0, 2))
    change_points = set((mo[1:][changed]).tolist())
    assert change_points and change_points <= listed


def _reference_row(row: dict) -> dict:
    info = caches.get_cache(row["cache"])
    return reference.structure(info.size, row["cpus"], row["cpus"], row["cpus"],
                               profiles.get_profile(row["profile"]), row["min_order"],
                               row["max_order"], row["min_objects"], info.early,
                               info.is_kmalloc, info.is_bootstrap, info.explicit_sheaf)


def test_a_slice_matches_the_scalar_reference(xl):
    """Rows of three chunks of fleet_xl's own grid, as a worker computes them (the chunk
    task, the frame the part is written from), against the scalar reference."""
    small = sweep_spec.from_dict({**xl.to_dict(), "chunk_size": 1500})
    d = {**small.to_dict(), "_hash": small.hash}
    rng = np.random.default_rng(15)
    picks = sorted(rng.choice(grid.n_chunks(small), 3, replace=False).tolist())
    frames = [runner.frame(small, chunk_task(d, int(i))["columns"]) for i in picks]
    df = pl.concat(frames)
    assert df.height == 3 * 1500
    assert df.select(small.axis_names).is_duplicated().sum() == 0
    for row in df.iter_rows(named=True):
        want = _reference_row(row)
        got = {m: row[m] for m in small.metrics}
        assert got == {m: want[m] for m in small.metrics}, row


XL_SLICE = """
[sweep]
name = "xl-slice"
chunk_size = 700
metrics = ["nr_cpus", "order", "objs_per_slab", "leftover", "cpu_partial_slabs"]

[topology]
cpus = [1, 2, 4095, 4096]

[cache]
cache = ["kmalloc-8", "kmalloc-192", "TCP", "task_struct"]

[kernel]
profile = ["v2.6.27", "v5.11", "v7.1"]

[boot]
min_order = [0, 3]
max_order = { range = [0, 10] }
min_objects = [0, 1, 40, 16385]
"""


@pytest.mark.ray
def test_interrupted_run_resumes_at_part_granularity_without_duplicates(ray_local, tmp_path):
    """A run killed while its workers were writing: two chunks committed, one part on disk
    that the manifest never marked done, and a half-written temporary.  --resume keeps the
    committed parts, recomputes the rest (replacing the orphan) and ends with every row
    once."""
    spec = sweep_spec.parse(XL_SLICE, "xl-slice.toml")
    assert grid.n_chunks(spec) >= 5
    d = {**spec.to_dict(), "_hash": spec.hash}
    run = store.create_run(tmp_path, spec=spec.to_dict(), spec_hash=spec.hash,
                           spec_text=XL_SLICE, n_chunks=grid.n_chunks(spec),
                           columns=runner.output_columns(spec), versions={}, git_revision=None)
    for i in (0, 3):
        res = chunk_task(d, i, part_dir=str(run.path))
        run.commit_part(i, res["part"], res["rows"])
    chunk_task(d, 1, part_dir=str(run.path))            # written, never committed
    (run.path / ".part-000002.parquet.tmp-99999").write_bytes(b"PAR1 half")
    kept = {p.name: p.stat().st_mtime_ns for p in run.part_paths()}
    assert run.scan().select(pl.len()).collect().item() == 2 * 700

    res = runner.run_sweep(spec, tmp_path, resume=run.run_id, progress=False)
    assert res.chunks_run == grid.n_chunks(spec) - 2
    done = store.open_run(run.path)
    assert done.complete and done.manifest["attempts"][-1]["workers_write_parts"] is True
    assert {p.name: p.stat().st_mtime_ns for p in done.part_paths() if p.name in kept} == kept
    assert not list(run.path.glob(".*.tmp-*"))
    got = done.collect()
    assert got.height == done.rows == grid.count_rows(spec)
    assert got.select(spec.axis_names).is_duplicated().sum() == 0
    # what a reader sees through a plain glob is the same rows, each once
    glob = pl.scan_parquet(str(run.path / "part-*.parquet")).collect()
    assert glob.sort(spec.axis_names).equals(got.sort(spec.axis_names))
    want = pl.concat([runner.frame(spec, chunk_task(d, i)["columns"])
                      for i in range(grid.n_chunks(spec))])
    assert got.equals(want)


@pytest.mark.parametrize("edit, message", [
    (("min_objects = [0, 1, 40, 16385]", "min_objects = [0, 1, 40, 40000]"),
     "xl.toml: boot.min_objects: value 40000 is outside 0..32767"),
    (('metrics = ["nr_cpus",', 'metrics = ["min_objects", "nr_cpus",'),
     "xl.toml: sweep.metrics: 'min_objects' is also an axis of this spec; a row has one "
     "column per name, so leave it out of metrics"),
    (("chunk_size = 700", "chunk_size = 0"),
     "xl.toml: sweep.chunk_size: must be an integer in 1..4194304, got 0"),
])
def test_bad_spec_is_one_line_naming_the_field(tmp_path, capsys, edit, message):
    bad = tmp_path / "xl.toml"
    bad.write_text(XL_SLICE.replace(*edit))
    for action in ("plan", "run"):
        code = cli.main(["sweep", action, str(bad), "--out", str(tmp_path / "runs")]
                        if action == "run" else ["sweep", action, str(bad)])
        out, err = capsys.readouterr()
        assert code == 2 and out == ""
        assert err == f"slabtune: error: {message}\n"
    assert not (tmp_path / "runs").exists()
