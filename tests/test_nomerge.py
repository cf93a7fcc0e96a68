"""``slub_nomerge`` / ``slab_nomerge``: a boot flag on the allow-list (model/bootparams.py),
parsed as the kernel parses it, validated strictly from users, rendered bare."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from slabtune.errors import SlabtuneError
from slabtune.model import bootparams
from slabtune.model.profiles import get_profile

sys.path.insert(0, str(Path(__file__).parent))
from test_bad_input import error_line, run  # noqa: E402

DATA = Path(__file__).parent / "data"
V618, V61, V31 = get_profile("v6.18"), get_profile("v6.1"), get_profile("v3.1")


def _cmdline(name: str) -> str:
    with open(DATA / name, newline="") as fh:
        return next(csv.DictReader(fh))["cmdline"]


def test_flag_spellings_by_version():
    assert set(bootparams.allowed_flags(V618)) == {"slub_nomerge", "slab_nomerge"}
    assert set(bootparams.allowed_flags(V61)) == {"slub_nomerge", "slab_nomerge"}
    assert set(bootparams.allowed_flags(V31)) == {"slub_nomerge"}


@pytest.mark.parametrize("line, profile, nomerge", [
    ("console=ttyS0", V618, False),
    ("slab_nomerge", V618, True),
    ("slub-nomerge", V61, True),
    # obsolete_checksetup() matches the __setup string as a prefix: the value is ignored
    ("slub_nomerge=1", V61, True),
    ("slub_nomerge slab_merge", V618, False),
    ("slab_merge slub_nomerge", V618, True),
    # v3.1 knows neither slab_nomerge nor slab_merge
    ("slab_nomerge", V31, False),
    ("slub_nomerge slub_merge", V31, True),
    ("x -- slub_nomerge", V618, False),
])
def test_parse_nomerge(line, profile, nomerge):
    assert bootparams.parse_nomerge(line, profile) is nomerge


def test_parse_nomerge_on_the_lab_boots():
    for topo in ("8cpu-2node", "16cpu-4node", "4cpu-2node-memoryless"):
        assert bootparams.parse_nomerge(_cmdline(f"guest-v7.2-{topo}-nomerge.csv"), V618)
        assert not bootparams.parse_nomerge(_cmdline(f"guest-v7.2-{topo}.csv"), V618)


def test_validate_params_flags():
    assert bootparams.validate_params({"slub_nomerge": True}, V61) == {"slub_nomerge": 1}
    assert bootparams.validate_params({"slab_nomerge": None, "slub_max_order": 2}, V618) == {
        "slub_nomerge": 1, "slub_max_order": 2}
    assert bootparams.validate_params({"slub_nomerge": 0}, V61) == {}
    with pytest.raises(SlabtuneError, match="slub_nomerge: a flag that takes no value"):
        bootparams.validate_params({"slub_nomerge": "1"}, V61)
    with pytest.raises(SlabtuneError, match="'slab_nomerge' is not allowed .* v3.1"):
        bootparams.validate_params({"slab_nomerge": True}, V31)
    with pytest.raises(SlabtuneError, match="given twice"):
        bootparams.validate_params({"slub_nomerge": 1, "slab_nomerge": 1}, V618)


def test_validate_cmdline_flags():
    assert bootparams.validate_cmdline("slab_nomerge slub_max_order=1", V618) == {
        "slub_nomerge": 1, "slub_max_order": 1}
    with pytest.raises(SlabtuneError, match="cmdline slub_nomerge=1: slub_nomerge is a flag"):
        bootparams.validate_cmdline("slub_nomerge=1", V618)
    with pytest.raises(SlabtuneError, match="cmdline slab_nomerge: not a nomerge spelling"):
        bootparams.validate_cmdline("slab_nomerge", V31)
    with pytest.raises(SlabtuneError, match="slab_no_merge"):
        bootparams.validate_cmdline("slab_no_merge", V618)


@pytest.mark.parametrize("profile, line", [
    (V618, "slab_max_order=2 slab_nomerge"),
    (V61, "slub_max_order=2 slub_nomerge"),
])
def test_render_is_parsed_back(profile, line):
    validated = bootparams.validate_params({"slub_max_order": 2, "slub_nomerge": 1}, profile)
    assert bootparams.render(validated, profile) == line
    assert bootparams.parse_nomerge(line, profile)
    assert bootparams.validate_cmdline(line, profile) == validated
    assert bootparams.cmdline_arg("slub_nomerge", 1) == "slub_nomerge"


@pytest.mark.parametrize("param, needle", [
    ("slub_nomerge=1", "slub_nomerge: a flag that takes no value"),
    ("slub_no_merge", "'slub_no_merge' is not NAME=VALUE"),
    ("slub_no_merge=1", "'slub_no_merge' is not allowed by any kernel profile"),
])
def test_guest_boot_refuses_bad_flags(tmp_path, monkeypatch, param, needle):
    monkeypatch.setenv("SLABTUNE_CACHE", str(tmp_path / "empty-cache"))
    rc, _, err = run("guest", "boot", "--param", "slub_nomerge", "--workload", "none")
    assert "not found" in error_line(rc, err) and "--param" not in err
    rc, _, err = run("guest", "boot", "--param", param, "--workload", "none")
    error_line(rc, err, "--param:", needle)


# --------------------------------------------------------------------------- the knob


def _quick_spec(profile: str, kernel_config: str):
    from slabtune.tuner import study

    text = (Path(__file__).parents[1] / "sweeps" / "tune_quick.toml").read_text()
    text = text.replace('profile = "v6.18"',
                        f'profile = "{profile}"\nkernel_config = "{kernel_config}"')
    return study.parse_spec(text, "quick")


def test_fleet_merge_roots_follow_the_merge_model():
    """The lab configuration on 6.1 merges skbuff_head_cache and maple_node (no ctor, no
    SLAB_NO_MERGE there; usercopy ignored) into kmalloc-256; a distribution kernel merges
    no two of these caches; 6.18 (sheaf request, SLAB_NO_MERGE skb heads) neither."""
    from slabtune.model import merging
    from slabtune.tuner import fleet

    for profile, kc in (("v6.1", "lab"), ("v6.1", "distro"), ("v6.18", "lab")):
        fl = _quick_spec(profile, kc).fleet
        roots = fleet.merge_roots(fl)
        usercopy, memcg = fleet.KERNEL_CONFIGS[kc]
        cfg = merging.MergeConfig(usercopy, memcg, fl.profile.version[:2])
        facts = merging.captured_facts([c.name for c in fl.caches], cfg,
                                       {c.name: c.size for c in fl.caches})
        for i in range(len(fl.caches)):
            j = roots[i]
            if j != i:      # merged: same flags and aligned size, both mergeable
                a, b = facts[i], facts[j]
                assert fl.caches[j].is_kmalloc or j < i
                assert (a.flags, a.size) == (b.flags, b.size)
                assert not merging.unmergeable(a, cfg, False)
                assert not merging.unmergeable(b, cfg, False)
        merged = {fl.caches[i].name for i in range(len(roots)) if roots[i] != i}
        lab61 = (profile, kc) == ("v6.1", "lab")
        assert merged == ({"skbuff_head_cache", "maple_node"} if lab61 else set())


def test_structural_objectives_share_a_merged_cache():
    from slabtune.tuner.objectives import FleetEvaluator

    lab = _quick_spec("v6.1", "lab")
    distro = _quick_spec("v6.1", "distro")
    pols = [{}, {"slub_nomerge": 1}, {"slub_max_order": 1}, {"slub_max_order": 1,
                                                              "slub_nomerge": 1}]
    e_lab = FleetEvaluator(lab.fleet, lab.objectives).evaluate(pols)
    e_dis = FleetEvaluator(distro.fleet, distro.objectives).evaluate(pols)
    # nothing merges on the distribution kernel: the flag changes nothing
    assert e_dis.memory[0] == e_dis.memory[1] and e_dis.time[0] == e_dis.time[1]
    # slub_nomerge on the lab kernel is the distribution kernel's fleet
    np = pytest.importorskip("numpy")
    np.testing.assert_allclose(e_lab.memory[[1, 3]], e_dis.memory[[1, 3]], rtol=1e-6)
    np.testing.assert_allclose(e_lab.time[[1, 3]], e_dis.time[[1, 3]], rtol=1e-5)
    # merged caches keep one set of per-CPU and node retention: less memory
    assert e_lab.memory[0] < e_lab.memory[1] and e_lab.memory[2] < e_lab.memory[3]


def test_export_renders_the_flag():
    from slabtune.results import export

    c = export.ExportedPolicy(study="s", trial=0, profile=V618, memory=1.0, time=1.0,
                              baseline={"memory": 1.0, "time": 1.0},
                              boot={"slub_nomerge": 1, "slub_max_order": 2}, sysfs={},
                              kernel_change=(), gains={}, params={"slub_nomerge": 1})
    assert export.render(c, "cmdline") == "slab_max_order=2 slab_nomerge\n"
    assert export.render(c, "cmdline", "slub") == "slub_max_order=2 slub_nomerge\n"
    assert export.report(c)["boot_params"] == {"slub_nomerge": 1, "slub_max_order": 2}
