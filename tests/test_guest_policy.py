"""``guest boot --policy``: both halves of an exported policy applied in a qemu guest (boot
parameters on the command line, per-cache sysfs values written before the first dump), and
``kernel check`` on that snapshot confirming that min_partial and cpu_partial took effect.

The parsing, the init script, the refusals and the check's policy columns run everywhere;
the end-to-end test boots the 6.1 lab kernel (scripts/build-kernels.sh) under TCG and is
marked ``guest`` and ``slow``.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from _cli import error_line, run

from slabtune.errors import SlabtuneError
from slabtune.kernel import build, check, guest, snapshot

DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "guest-v6.1-4cpu-2node.csv"


# --------------------------------------------------------------------------- the sysfs half


def test_policy_writes_are_checked_and_ordered():
    got = guest.policy_writes({"kmalloc-64": {"min_partial": 3, "cpu_partial": 40},
                               "dentry": {"min_partial": 0}})
    assert got == (("dentry", "min_partial", 0), ("kmalloc-64", "cpu_partial", 40),
                   ("kmalloc-64", "min_partial", 3))
    assert guest.policy_file(got) == b"dentry min_partial 0\nkmalloc-64 cpu_partial 40\n" \
                                     b"kmalloc-64 min_partial 3\n"


@pytest.mark.parametrize("sysfs, pattern", [
    ({"../x": {"min_partial": 1}}, "cache name '../x' is not a plain cache name"),
    ({"a b": {"min_partial": 1}}, "is not a plain cache name"),
    ({"a;reboot": {"min_partial": 1}}, "is not a plain cache name"),
    ({"kmalloc-64": {"order": 1}}, "'order' is not one of min_partial, cpu_partial"),
    ({"kmalloc-64": {"min_partial": -1}}, "kmalloc-64.min_partial: -1 is not an integer"),
    ({"kmalloc-64": {"min_partial": 1 << 32}}, "is not an integer in 0..4294967295"),
    ({"kmalloc-64": {"cpu_partial": True}}, "cpu_partial: True is not an integer"),
    ({"kmalloc-64": [1]}, "sysfs.kmalloc-64: not a table"),
])
def test_bad_policy_values_are_refused(sysfs, pattern):
    with pytest.raises(SlabtuneError, match=pattern.replace(".", r"\.").replace("(", r"\(")):
        guest.policy_writes(sysfs)


def test_init_script_reads_the_policy_as_data():
    """Cache names never enter the script: it reads /policy with ``read`` and quotes every
    use; the writes come before the first dump."""
    text = guest.init_script("abc123", policy=True)
    assert "kmalloc" not in text
    lines = [ln.strip() for ln in text.splitlines()]
    assert lines.index("done < /policy") < lines.index("dump warm > /dev/null")
    assert 'echo "$v" > "$d/$a" 2>/dev/null' in lines
    assert "/policy" not in guest.init_script("abc123")


def test_policy_records_become_snapshot_columns():
    """``Y`` records: a write through a merged alias lands on its target cache; a missing
    cache is kept with no target; a refused write fails the boot."""
    console = "\n".join([
        "@@ST S tok 0.5",
        "@@ST Y kmalloc-64 kmalloc-64 min_partial 3 0",
        "@@ST Y skbuff_head_cache - min_partial 3 missing",
        "@@ST Y dentry kmalloc-192 cpu_partial 30 0",
        "@@ST E tok",
    ])
    parsed = guest.parse_console(console, "tok")
    assert parsed.policy[1] == {"cache": "skbuff_head_cache", "target": None,
                                "attr": "min_partial", "value": 3, "rc": None}
    writes = (("dentry", "cpu_partial", 30), ("kmalloc-64", "min_partial", 3),
              ("skbuff_head_cache", "min_partial", 3))
    assert "reported as" in guest._policy_error(writes, parsed.policy)
    order = [parsed.policy[i] for i in (2, 0, 1)]
    assert guest._policy_error(writes, order) == ""
    refused = [dict(order[0], rc=1)] + order[1:]
    assert "the kernel refused 30 for /sys/kernel/slab/dentry/cpu_partial" in \
        guest._policy_error(writes, refused)
    df = pl.DataFrame({"cache": ["kmalloc-192", "kmalloc-64", "filp"]})
    out = guest.with_policy_columns(df, parsed.policy)
    assert out["set_min_partial"].to_list() == [None, 3, None]
    assert out["set_cpu_partial"].to_list() == [30, None, None]


def _fixture_with(values: dict[str, dict[str, int]]) -> pl.DataFrame:
    """The committed 6.1 guest snapshot (4 CPUs, 2 nodes, slub_max_order=2) with policy
    columns saying ``values`` were written."""
    df = snapshot.read_snapshot(FIXTURE)
    cols = []
    for col in snapshot.POLICY_COLUMNS:
        attr = col.removeprefix("set_")
        m = {c: v[attr] for c, v in values.items() if attr in v}
        cols.append(pl.col("cache").replace_strict(m, default=None,
                                                    return_dtype=pl.Int64).alias(col))
    return df.with_columns(cols)


def test_check_compares_written_values_not_the_models_defaults(tmp_path):
    """The fixture's kmalloc-64 shows min_partial 5 and cpu_partial 120 (the v6.1
    defaults).  A snapshot saying those values were written counts them as taken; one
    saying 3 and 40 were written (what the kernel does not show) is two mismatches, and
    the rest of the check is as without a policy.  The columns survive CSV."""
    plain = check.check_snapshot(snapshot.read_snapshot(FIXTURE))
    assert plain.ok and plain.policy == {}
    taken = check.check_snapshot(_fixture_with({"kmalloc-64": {"min_partial": 5,
                                                               "cpu_partial": 120}}))
    assert taken.ok and taken.matched == plain.matched
    assert taken.policy == {"min_partial": check.FieldCount(1, 1),
                            "cpu_partial": check.FieldCount(1, 1)}
    path = snapshot.write_snapshot(_fixture_with({"kmalloc-64": {"min_partial": 3,
                                                                 "cpu_partial": 40}}),
                                   tmp_path / "p.csv")
    lost = check.check_snapshot(snapshot.read_snapshot(path))
    assert not lost.ok and lost.matched == plain.matched - 1
    assert {(m.cache, m.field, m.kernel, m.model) for m in lost.mismatches} == {
        ("kmalloc-64", "min_partial", 5, 3), ("kmalloc-64", "cpu_partial", 120, 40)}
    assert lost.to_json()["policy"] == {"min_partial": {"matched": 0, "total": 1},
                                        "cpu_partial": {"matched": 0, "total": 1}}


# --------------------------------------------------------------------------- the CLI


def _policy(tmp_path, doc) -> Path:
    p = tmp_path / "policy.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


@pytest.mark.parametrize("doc, extra, needles", [
    ("{nope", (), ["--policy", "not JSON"]),
    ({"cmdline": ""}, (), ["not a policy (no boot_params and sysfs"]),
    ({"boot_params": {"slub_debug": 1}, "sysfs": {}}, (),
     ["--policy: boot parameter 'slub_debug' is not allowed"]),
    ({"boot_params": {"slub_max_order": "2"}, "sysfs": {}}, (),
     ["boot_params is not a table of integers"]),
    ({"boot_params": {}, "sysfs": {"x/y": {"min_partial": 1}}}, (),
     ["--policy", "cache name 'x/y' is not a plain cache name"]),
    ({"boot_params": {}, "sysfs": {}, "slabinfo": ['echo "a 1 1 0" > /proc/slabinfo']}, (),
     ["/proc/slabinfo tunables are not applied"]),
    ({"boot_params": {}, "sysfs": {}}, ("--param", "slub_max_order=1"),
     ["--policy: give boot parameters in the policy or with --param, not both"]),
])
def test_cli_bad_policy_is_one_line_before_qemu(tmp_path, doc, extra, needles):
    rc, _out, err = run("guest", "boot", "--policy", _policy(tmp_path, doc), *extra,
                        "--kernel", "/nonexistent/bzImage")
    error_line(rc, err, *needles)


def test_cli_policy_that_is_not_a_regular_file_is_refused(tmp_path):
    rc, _out, err = run("guest", "boot", "--policy", "/dev/zero")
    error_line(rc, err, "--policy: /dev/zero is a character device, not a regular file")
    rc, _out, err = run("guest", "boot", "--policy", tmp_path)
    error_line(rc, err, "--policy", "is a directory")


# --------------------------------------------------------------------------- end to end


#: A 2-CPU fleet on the 6.1 lab kernel's profile, searching the boot and sysfs knobs.
SPEC = """
[fleet]
profile = "v6.1"
[[fleet.topology]]
name = "guest-2"
cpus = 2
[[fleet.workload]]
[fleet.workload.caches]
"kmalloc-64" = { live_per_cpu = 1024 }
"kmalloc-256" = { live_per_cpu = 512 }
"kmalloc-1k" = { live_per_cpu = 256 }
[search]
[search.knobs]
slub_min_objects = { choices = [0, 8] }
min_partial_lo = { low = 0, high = 10 }
min_partial_hi = { low = 0, high = 10 }
cpu_partial_small = { low = 0, high = 240, step = 8 }
cpu_partial_256 = { low = 0, high = 120, step = 4 }
cpu_partial_1k = { low = 0, high = 48, step = 2 }
"""
#: The trial exported: every knob off the v6.1 default (min_partial 5 for these sizes,
#: cpu_partial 120 / 52 / 24), so a value the guest did not write would show.
POLICY = {"slub_min_objects": 8, "min_partial_lo": 3, "min_partial_hi": 3,
          "cpu_partial_small": 40, "cpu_partial_256": 20, "cpu_partial_1k": 6}


@pytest.mark.guest
@pytest.mark.slow
def test_exported_trial_applied_in_a_guest_and_confirmed_by_kernel_check(tmp_path):
    """One trial of a v6.1 study exported as JSON, booted on the 6.1 lab kernel with
    ``guest boot --policy``: the command line carries slub_min_objects=8, the guest
    wrote min_partial 3 and the trial's cpu_partial to each fleet cache before its first
    dump, and ``kernel check`` on the snapshot matches every comparable cache with the
    written values taken (3/3 min_partial, 3/3 cpu_partial)."""
    if build.kernel_path("6.1") is None:
        pytest.skip("kernel 6.1 is not built; run scripts/build-kernels.sh --only 6.1")
    try:
        guest.find_assets(kernel=build.kernel_path("6.1"))
    except SlabtuneError as err:
        pytest.skip(f"guest stack not installed ({err}); run scripts/install-guest-deps.sh")
    from slabtune.tuner import study as studies

    spec = studies.parse_spec(SPEC, "gpolicy")
    url = f"journal:{tmp_path / 'study.log'}"
    runner, _ = studies.create_or_resume(spec, "gpolicy", url)
    runner.record([POLICY], runner.evaluate([POLICY]))
    (trial,) = runner.study.get_trials()
    policy = tmp_path / "policy.json"
    rc, _out, err = run("export", "--study", "gpolicy", "--storage", url, "--trial",
                        trial.number, "--format", "json", "--out", policy)
    assert rc == 0, err
    doc = json.loads(policy.read_text())
    assert doc["reach"] == "boot+sysfs" and doc["boot_params"] == {"slub_min_objects": 8}
    assert doc["sysfs"] == {"kmalloc-64": {"min_partial": 3, "cpu_partial": 40},
                            "kmalloc-256": {"min_partial": 3, "cpu_partial": 20},
                            "kmalloc-1k": {"min_partial": 3, "cpu_partial": 6}}

    snap = tmp_path / "guest.parquet"
    rc, out, err = run("guest", "boot", "--kernel", "6.1", "--policy", policy, "--cpus", "2",
                       "--workload", "none", "--accel", "tcg", "--timeout", "240",
                       "--out", snap, "--json")
    assert rc == 0, (out, err)
    summary = json.loads(out)
    assert "slub_min_objects=8" in summary["cmdline"].split()
    assert [(w["cache"], w["attr"], w["value"], w["rc"]) for w in summary["policy"]] == [
        (c, a, v, 0) for c, vals in sorted(doc["sysfs"].items())
        for a, v in sorted(vals.items())]
    df = snapshot.read_snapshot(snap)
    rows = {r["cache"]: r for r in df.to_dicts()}
    for cache, vals in doc["sysfs"].items():
        assert rows[cache]["min_partial"] == vals["min_partial"] == rows[cache]["set_min_partial"]
        assert rows[cache]["cpu_partial"] == vals["cpu_partial"] == rows[cache]["set_cpu_partial"]

    rc, out, err = run("kernel", "check", "--snapshot", snap, "--json")
    assert rc == 0, (out, err)
    res = json.loads(out)
    assert res["policy"] == {"min_partial": {"matched": 3, "total": 3},
                             "cpu_partial": {"matched": 3, "total": 3}}
    assert res["matched"] == res["comparable"] > 50
    assert res["boot_details"][0]["params"]["min_objects"] == 8

