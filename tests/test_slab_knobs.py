"""Bad input, issue 14 item 5: a knob of the other allocator is a one-line error naming the
knob and the profile, exit 2 through the real CLI.

SLUB-only: sheaf_capacity, cpu_partial, min_partial, barns_on_memoryless_nodes and the
slub_* boot parameters (and slab_min_order/slab_min_objects, SLUB's v6.8 spellings).
SLAB-only: the /proc/slabinfo tunables limit, batchcount, shared, and slab_max_order before
v6.8 (from v6.8 it is SLUB's own spelling of slub_max_order).
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import tomli_w

from slabtune import cli
from slabtune.errors import SlabtuneError
from slabtune.model import bootparams, profiles, slab
from slabtune.sweeps import simconfig
from slabtune.tuner import space, study

V61 = profiles.PROFILES["v6.1"]
SLAB61 = profiles.SLAB_PROFILES["slab-v6.1"]
BASE = {
    "topology": {"cpus": 4, "nodes": 2},
    "cache": {"name": "kmalloc-512"},
    "policy": {"profile": "v6.1"},
    "workload": {"kind": "local"},
    "run": {"steps": 100, "seed": 1},
}


def _simulate(tmp_path, profile: str, params: dict) -> tuple[int, str, str]:
    doc = {**BASE, "policy": {"profile": profile, "params": params}}
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomli_w.dumps(doc))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["simulate", str(cfg), "--json"])
    return rc, out.getvalue(), err.getvalue()


def _one_line(rc: int, out: str, err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (rc, err)
    assert out == ""
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("slabtune: error: "), lines[0]
    return lines[0].removeprefix("slabtune: error: ")


@pytest.mark.parametrize("knob, value, what", [
    ("sheaf_capacity", 32, "sheaves"),
    ("cpu_partial", 30, "per-CPU partial lists"),
    ("min_partial", 5, "partial slabs a node keeps"),
    ("barns_on_memoryless_nodes", True, "sheaves and barns"),
    ("slub_min_order", 1, "SLUB's order floor, a boot parameter"),
    ("slub_max_order", 1, "SLUB's order cap, a boot parameter"),
    ("slub_min_objects", 8, "SLUB's objects-per-slab target, a boot parameter"),
    ("slab_min_order", 1, "SLUB's order floor, a boot parameter (v6.8 spelling)"),
])
def test_a_slub_knob_on_a_slab_profile(tmp_path, knob, value, what):
    line = _one_line(*_simulate(tmp_path, "slab-v6.1", {knob: value}))
    assert line == (f"{tmp_path / 'c.toml'}: policy.params.{knob}: {knob} is a SLUB knob "
                    f"({what}); profile slab-v6.1 is SLAB")


@pytest.mark.parametrize("profile", ["v6.1", "v5.10", "v7.1"])
@pytest.mark.parametrize("knob, what", [
    ("limit", "per-CPU array size, a /proc/slabinfo tunable"),
    ("batchcount", "objects per array refill or flush, a /proc/slabinfo tunable"),
    ("shared", "shared array factor, a /proc/slabinfo tunable"),
])
def test_a_slab_knob_on_a_slub_profile(tmp_path, profile, knob, what):
    line = _one_line(*_simulate(tmp_path, profile, {knob: 8}))
    assert line.endswith(f"policy.params.{knob}: {knob} is a SLAB knob ({what}); "
                         f"profile {profile} is SLUB"), line


def test_slab_max_order_is_slab_only_before_v6_8(tmp_path):
    line = _one_line(*_simulate(tmp_path, "v6.1", {"slab_max_order": 1}))
    assert line.endswith("policy.params.slab_max_order: slab_max_order is a SLAB knob "
                         "(SLAB's slab order cap, a boot parameter); profile v6.1 is SLUB")
    # v6.18 spells slub_max_order that way: not an error of this kind
    doc = simconfig.parse_policy({"profile": "v6.18", "params": {"slab_max_order": 1}}, None)
    assert doc[2] == {"slub_max_order": 1}


def test_slab_knobs_on_a_slab_profile_are_checked_then_run(tmp_path):
    """A SLAB config with its own knobs right runs the SLAB dynamics with them; each wrong
    one is a one-line error naming it."""
    rc, out, err = _simulate(tmp_path, "slab-v6.1", {"limit": 60, "batchcount": 30,
                                                     "slab_max_order": 0})
    assert rc == 0, err
    row = json.loads(out)
    assert (row["allocator"], row["limit"], row["batchcount"], row["order"]) == \
        ("SLAB", 60, 30, 0)
    for params, needle in (
            ({"limit": 0}, "policy.params.limit: 0 is below 1"),
            ({"limit": 10, "batchcount": 20}, "policy.params.batchcount: 20 is above limit 10"),
            ({"slab_max_order": 11}, "policy.params.slab_max_order: 11 is above 10"),
            ({"shared": "8"}, "policy.params.shared: '8' is not an integer"),
            ({"memoryless_fallback": 1}, "policy.params.memoryless_fallback: 1 is not true "
                                         "or false"),
            ({"colour": 1}, "policy.params.colour: unknown knob for SLAB profile slab-v6.1 "
                            "(allowed: limit, batchcount, shared, slab_max_order, "
                            "memoryless_fallback)")):
        assert _one_line(*_simulate(tmp_path, "slab-v6.1", params)).endswith(needle), params
    line = _one_line(*_simulate(tmp_path, "slab-v3.1", {"slab_max_order": 0}))
    assert line.endswith("policy.params.slab_max_order: profile slab-v3.1 has no such boot "
                         "parameter (slab_max_order= came in v3.4)")


def test_boot_parameter_validation_names_the_allocator():
    with pytest.raises(SlabtuneError) as err:
        bootparams.validate_params({"slab_max_order": 1}, V61)
    assert str(err.value) == (
        "boot parameter 'slab_max_order' is not allowed for kernel profile v6.1: "
        "slab_max_order is a SLAB knob (SLAB's slab order cap, a boot parameter); profile "
        "v6.1 is SLUB (allowed: slub_min_order, slub_max_order, slub_min_objects, slub_nomerge, "
        "slab_nomerge)")


@pytest.mark.parametrize("knob", ["limit", "batchcount", "shared", "slab_max_order"])
def test_a_slab_knob_in_a_slub_search_space(knob):
    with pytest.raises(SlabtuneError) as err:
        space.parse_knob(knob, {}, V61)
    assert str(err.value).startswith(f"search.knobs.{knob}: {knob} is a SLAB knob (")
    assert str(err.value).endswith("); profile v6.1 is SLUB")
    text = ('[fleet]\nprofile = "v6.1"\n[[fleet.topology]]\ncpus = 4\n[[fleet.workload]]\n'
            '[fleet.workload.caches]\n"kmalloc-64" = { live_per_cpu = 100 }\n'
            f'[search.knobs]\n{knob} = {{}}\n')
    with pytest.raises(SlabtuneError, match=f"search.knobs.{knob}: {knob} is a SLAB knob"):
        study.parse_spec(text)


def test_a_slub_knob_in_a_slab_study_is_one_line():
    """tune takes SLAB fleets (tests/test_tune_slab.py); a SLUB knob in one is refused."""
    text = ('[fleet]\nprofile = "slab-v6.1"\n[[fleet.topology]]\ncpus = 4\n[[fleet.workload]]'
            '\n[fleet.workload.caches]\n"kmalloc-64" = { live_per_cpu = 100 }\n'
            '[search.knobs]\nslub_max_order = {}\n')
    with pytest.raises(SlabtuneError, match="search.knobs.slub_max_order: slub_max_order is a "
                                            "SLUB knob .*; profile slab-v6.1 is SLAB"):
        study.parse_spec(text)


def test_foreign_knob_leaves_each_allocators_own_knobs_alone():
    for k in ("limit", "batchcount", "shared", "slab_max_order", "memoryless_fallback"):
        assert slab.foreign_knob(k, SLAB61) is None
    for k in ("min_partial", "cpu_partial", "sheaf_capacity", "slub_max_order",
              "memoryless_fallback"):
        assert slab.foreign_knob(k, V61) is None
    assert slab.foreign_knob("slab_max_order", profiles.PROFILES["v6.18"]) is None
