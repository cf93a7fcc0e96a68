"""Sweep specs: schema validation, axis forms, built-in specs, and lazy grid expansion
checked against itertools.product.  No JAX, no Ray."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from slabtune.errors import SlabtuneError
from slabtune.model import caches, profiles
from slabtune.sweeps import grid
from slabtune.sweeps import spec as sweep_spec

BASE = """
[sweep]
name = "t"
chunk_size = 7
[topology]
cpus = [1, 2, 64]
[cache]
cache = ["kmalloc-64", "maple_node"]
[kernel]
profile = ["v5.11", "v6.18"]
"""


def with_(extra: str, base: str = BASE) -> str:
    return base + "\n" + extra


# --------------------------------------------------------------------------- built-ins


@pytest.mark.parametrize("name", sweep_spec.BUILTIN_SPECS)
def test_builtin_specs_load_and_are_consistent(name):
    spec = sweep_spec.load(name)
    assert spec.name == name
    assert spec.evaluator == "structural"
    assert grid.count_rows(spec) > 0
    assert sweep_spec.from_dict(spec.to_dict()) == spec
    assert sweep_spec.load(name).hash == spec.hash


def test_fleet_is_a_million_configs_over_1_to_8192_cpus_and_kmalloc():
    spec = sweep_spec.load("fleet")
    assert grid.count_rows(spec) == 2**20 >= 10**6
    assert spec.axis("cpus").values == tuple(range(1, 8193))
    kmalloc = {c.name for c in caches.CACHES.values() if c.is_kmalloc}
    assert kmalloc <= set(spec.axis("cache").values)
    assert set(spec.axis("profile").values) == set(profiles.PROFILES)


def test_memoryless_spec_only_keeps_possible_topologies():
    spec = sweep_spec.load("memoryless")
    rows = grid.axis_columns(spec, 0, spec.product)
    keep = ~grid.excluded(spec, rows)
    assert (rows["memoryless_nodes"][keep] < rows["nodes"][keep]).all()
    assert (rows["memoryless_nodes"][keep] > 0).any()
    assert (rows["cpus_per_node"] * rows["nodes"])[keep].max() <= 8192


# --------------------------------------------------------------------------- axis forms


def test_range_logrange_and_groups_expand():
    spec = sweep_spec.parse(with_("""
[boot]
min_order = { range = [0, 6], step = 3 }
min_objects = { logrange = [4, 64], factor = 2 }
max_order = { logrange = [1, 10], num = 3 }
""").replace('cpus = [1, 2, 64]', 'cpus = { logrange = [1, 8192], factor = 2 }'))
    assert spec.axis("cpus").values == tuple(2**k for k in range(14))
    assert spec.axis("min_order").values == (0, 3, 6)
    assert spec.axis("min_objects").values == (4, 8, 16, 32, 64)
    assert spec.axis("max_order").values == (1, 3, 10)  # 1, sqrt(10) ~ 3.16, 10


def test_aliases_are_canonicalised():
    spec = sweep_spec.parse(BASE.replace('"kmalloc-64"', '"kmalloc-1024"')
                            .replace('"v5.11"', '"5.11"'))
    assert spec.axis("cache").values == ("kmalloc-1k", "maple_node")
    assert spec.axis("profile").values == ("v5.11", "v6.18")


def test_group_names_expand():
    spec = sweep_spec.parse(BASE.replace('["kmalloc-64", "maple_node"]', '"kmalloc"')
                   .replace('["v5.11", "v6.18"]', '"all"'))
    assert spec.axis("cache").values == tuple(caches.kmalloc_name(s) for s in caches.KMALLOC_SIZES)
    assert spec.axis("profile").values == tuple(profiles.PROFILES)


def test_hash_ignores_description_but_not_axes():
    a = sweep_spec.parse(BASE)
    b = sweep_spec.parse(BASE.replace('name = "t"', 'name = "t"\ndescription = "words"'))
    c = sweep_spec.parse(BASE.replace("[1, 2, 64]", "[1, 2, 65]"))
    assert a.hash == b.hash != c.hash


def test_defaults_fill_absent_axes():
    spec = sweep_spec.parse(BASE)
    d = dict(spec.defaults)
    assert d["max_order"] == profiles.DEFAULT_MAX_ORDER and d["min_order"] == 0
    assert d["nodes"] == 1 and d["explicit_sheaf"] == -1
    assert "cpus_per_node" not in d and "size" not in d


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("text, field", [
    ("[sweep]\nname = 't'\n[bogus]\nx = 1", "bogus: unknown section"),
    (BASE.replace("[1, 2, 64]", "[1, 9000]"), "topology.cpus: value 9000 is outside 1..8192"),
    (BASE.replace("[1, 2, 64]", "[]"), "topology.cpus: empty list"),
    (BASE.replace("[1, 2, 64]", "[1, 1]"), "topology.cpus: duplicate value 1"),
    (BASE.replace("[1, 2, 64]", '"many"'), "topology.cpus: expected an integer"),
    (BASE.replace("[1, 2, 64]", "[1.5]"), "topology.cpus: 1.5 is not an integer"),
    (BASE.replace("[1, 2, 64]", "{ range = [8, 2] }"),
     "topology.cpus.range: start 8 is above stop 2"),
    (BASE.replace("[1, 2, 64]", "{ logrange = [1, 8], factor = 1 }"), "topology.cpus.factor"),
    (BASE.replace("[1, 2, 64]", "{ span = [1, 8] }"), "topology.cpus: unknown range form"),
    (BASE.replace('"maple_node"', '"no_such_cache"'), "cache.cache: unknown value 'no_such_cache'"),
    (BASE.replace('"v6.18"', '"v9.9"'), "kernel.profile: unknown value 'v9.9'"),
    (BASE.replace("chunk_size = 7", "chunk_size = 0"), "sweep.chunk_size"),
    (BASE.replace("chunk_size = 7", "chunk_size = 7\ncolour = 1"), "sweep.colour: unknown key"),
    (BASE.replace('name = "t"', 'name = "a b"'), "sweep.name"),
    (BASE.replace("chunk_size = 7", 'evaluator = "magic"'), "sweep.evaluator: unknown evaluator"),
    (BASE.replace("chunk_size = 7", 'metrics = ["order", "speed"]'),
     "sweep.metrics: unknown metric 'speed'"),
    (BASE.replace("[kernel]\nprofile = [\"v5.11\", \"v6.18\"]", ""), "kernel.profile: missing"),
    (BASE.replace("cpus = [1, 2, 64]", "cpus_per_node = [2]"),
     "topology.nodes: required with cpus_per_node"),
    (with_("[boot]\nslub_debug = 1"), "boot.slub_debug: unknown axis"),
    (with_("[boot]\nmax_order = 11"), "boot.max_order: value 11 is outside 0..10"),
    (with_("[cache]\nsize = [64]"), "not valid TOML"),  # [cache] defined twice
    (with_("[[exclude]]\nnodes = 2"), "exclude[0].nodes: not an axis of this spec"),
    (with_("[[exclude]]\ncpus = { about = 2 }"), "exclude[0].cpus.about: unknown comparison"),
    (with_("[[exclude]]\ncpus = { gt = \"nodes\" }"),
     "exclude[0].cpus.gt: 'nodes' is not an integer axis"),
    (with_("[[exclude]]\nprofile = \"v7.0\""),
     "exclude[0].profile.eq: 'v7.0' is not a value of axis profile"),
    (with_("[[exclude]]\nprofile = { gt = \"v5.11\" }"), "supports only eq, ne and in"),
    ("[sweep\nname=1", "not valid TOML"),
])
def test_bad_specs_name_the_field(text, field):
    with pytest.raises(SlabtuneError) as exc:
        sweep_spec.parse(text, "x.toml")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("x.toml: ")
    assert field in msg, msg


def test_duplicate_section_keys_give_one_line():
    # cpus and cpus_per_node together, cache and size together
    with pytest.raises(sweep_spec.SpecError,
                       match="topology.cpus: give exactly one of cpus or cpus_per_node"):
        sweep_spec.parse(BASE.replace("cpus = [1, 2, 64]",
                                      "cpus = [1]\ncpus_per_node = [1]\nnodes = 1"))
    with pytest.raises(sweep_spec.SpecError, match="cache.cache: give exactly one of cache"):
        sweep_spec.parse(BASE.replace("[kernel]", "size = [64]\n[kernel]"))


def test_load_unknown_name_or_missing_file(tmp_path):
    with pytest.raises(sweep_spec.SpecError, match="neither a file nor a built-in spec"):
        sweep_spec.load("nonesuch")
    p = tmp_path / "bad.toml"
    p.write_bytes(b"\xff\xfe")
    with pytest.raises(sweep_spec.SpecError, match="not UTF-8"):
        sweep_spec.load(str(p))


# --------------------------------------------------------------------------- grid


GRID = """
[sweep]
name = "g"
chunk_size = 5
[topology]
cpus = [1, 3, 8]
nodes = [1, 2]
memoryless_nodes = [0, 1]
[cache]
cache = ["kmalloc-8", "task_struct"]
[kernel]
profile = ["v5.10", "v7.1"]
[boot]
min_order = [0, 2]
max_order = [1, 3]

[[exclude]]
min_order = { gt = "max_order" }

[[exclude]]
profile = "v5.10"
cpus = { in = [3, 8] }
nodes = 2
"""


def _brute_force(spec):
    rows = []
    for combo in itertools.product(*(a.values for a in spec.axes)):
        r = dict(zip(spec.axis_names, combo))
        if r["memoryless_nodes"] >= r["nodes"]:
            continue
        if r["min_order"] > r["max_order"]:
            continue
        if r["profile"] == "v5.10" and r["cpus"] in (3, 8) and r["nodes"] == 2:
            continue
        rows.append(combo)
    return rows


def test_chunks_reproduce_the_product_minus_exclusions():
    spec = sweep_spec.parse(GRID)
    assert spec.product == 3 * 2 * 2 * 2 * 2 * 2 * 2
    expect = _brute_force(spec)
    got = []
    assert grid.n_chunks(spec) == math.ceil(spec.product / 5)
    for i in range(grid.n_chunks(spec)):
        ch = grid.chunk(spec, i)
        assert len(ch.keep) == grid.bucket(5) == 256  # one shape for every chunk
        assert not ch.keep[ch.n_product:].any()   # padding is never kept
        for r in np.flatnonzero(ch.keep):
            got.append(tuple(
                ch.columns[a.name][r] if a.kind is int else a.values[ch.columns[a.name][r]]
                for a in spec.axes))
    assert got == expect
    assert grid.count_rows(spec) == len(expect)


def test_chunk_defaults_and_cpus_per_node():
    spec = sweep_spec.parse("""
[sweep]
name = "n"
chunk_size = 4
[topology]
cpus_per_node = [4096, 8192]
nodes = [1, 2]
[cache]
size = [8, 2097152]
[kernel]
profile = "v7.0"
""")
    ch = grid.chunk(spec, 0)
    assert (ch.columns["max_order"] == 3).all() and (ch.columns["possible"] == 0).all()
    cpus = grid.present_cpus({k: v[:4] for k, v in ch.columns.items()})
    # product order: cpus_per_node, nodes, size, profile (last fastest)
    assert list(cpus) == [4096, 4096, 8192, 8192]
    assert grid.count_rows(spec) == 6  # 8192 x 2 nodes is more than MAX_CPUS


def test_chunk_index_out_of_range():
    spec = sweep_spec.parse(BASE)
    with pytest.raises(IndexError):
        grid.chunk(spec, grid.n_chunks(spec))


def test_bucket_is_a_power_of_two_at_least_256():
    assert [grid.bucket(n) for n in (1, 256, 257, 65536, 100000)] == [256, 256, 512, 65536, 131072]


def test_sim_config_distances_round_trip_and_decide_the_memory_node():
    """[topology] distances (a SLIT) parse, print back in to_doc/describe, and decide which
    memory node a memoryless node's reps take their slabs from."""
    import tomllib

    from slabtune.model import workloads
    from slabtune.sweeps import simconfig

    doc = tomllib.loads("""
[topology]
cpus = 32
nodes = 4
memoryless_nodes = [1, 2]
distances = [[10, 30, 40, 20], [30, 10, 20, 20], [15, 20, 10, 25], [20, 20, 25, 10]]
[cache]
name = "kmalloc-256"
[policy]
profile = "v7.0"
[workload]
kind = "local"
[run]
steps = 10
seed = 1
""")
    spec = simconfig.parse_doc(doc)
    assert spec.topology.distances[2] == (15, 20, 10, 25)
    assert simconfig.parse_doc(spec.to_doc()) == spec
    assert spec.describe()["topology"]["distances"][0] == [10, 30, 40, 20]
    g = workloads.node_groups(spec.topology)
    # node 1 -> node 3 (class 1), node 2 -> node 0 (class 0) by its own SLIT row
    assert g["mem_class"] == [0, 1, 0, 1]
    without = dict(doc, topology={k: v for k, v in doc["topology"].items()
                                  if k != "distances"})
    plain = simconfig.parse_doc(without)
    assert plain.topology.distances is None and "distances" not in plain.to_doc()["topology"]
    assert workloads.node_groups(plain.topology)["mem_class"] == [0, 1, 1, 1]
