"""Export: command lines that parse back to the trial's values, GRUB drop-ins, tmpfiles.d
lines, JSON reports; kernel-change knobs listed; bad trials and values fail cleanly."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from _tune_helpers import assert_clean_error, quick_study, run_cli

from slabtune.errors import SlabtuneError
from slabtune.model import bootparams, profiles
from slabtune.results import export
from slabtune.tuner import objectives
from slabtune.tuner import study as studies


def _front():
    study, url, runner = quick_study()
    return study, url, runner, [t.number for t in study.best_trials]


@pytest.mark.slow
def test_exported_cmdlines_parse_back_to_the_trial_values():
    study, _url, runner, front = _front()
    prof = runner.spec.fleet.profile
    for n in front:
        c = studies.candidate(study, n)
        line = export.render(c, "cmdline").strip()
        assert all(a.split("=")[0].startswith("slab_") for a in line.split())
        eff = studies.effective_params(study.trials[n].params, runner.spec)
        assert bootparams.parse_cmdline(line, prof) == bootparams.SlubParams(
            eff["slub_min_order"], eff["slub_max_order"], eff["slub_min_objects"])
        slub = export.render(c, "cmdline", prefix="slub").strip()
        assert bootparams.parse_cmdline(slub, prof) == bootparams.parse_cmdline(line, prof)


@pytest.mark.slow
def test_grub_tmpfiles_and_json_formats():
    study, _url, runner, front = _front()
    c = studies.candidate(study, front[len(front) // 2])
    grub = export.render(c, "grub")
    frag = export.boot_fragment(c)
    if frag:
        assert (f'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT {frag}"'
                in grub.splitlines())
    assert all(ln.startswith("#") or ln.startswith("GRUB_CMDLINE_LINUX_DEFAULT=")
               for ln in grub.splitlines())
    values = objectives.cache_values(runner.spec.fleet,
                                     studies.effective_params(c.params, runner.spec))
    body = [ln for ln in export.render(c, "tmpfiles").splitlines() if not ln.startswith("#")]
    assert len(body) == 2 * len(runner.spec.fleet.caches)  # min_partial and cpu_partial each
    for ln in body:
        m = re.fullmatch(r"w /sys/kernel/slab/([\w.-]+)/(min_partial|cpu_partial) "
                         r"- - - - (\d+)", ln)
        assert m, ln
        assert int(m.group(3)) == values[m.group(1)][m.group(2)]
    rep = json.loads(export.render(c, "json"))
    assert rep["trial"] == c.trial and rep["cmdline"] == frag
    assert set(rep["gains"]) == set(runner.spec.fleet.topology_names)
    assert rep["baseline"]["memory"] == pytest.approx(
        study.user_attrs["slabtune_baseline"]["memory"])


def test_kernel_change_knobs_are_listed_never_dropped():
    study, _url, _runner, _front_ = _front()
    t = next(t for t in study.trials
             if t.params["order_objects_mul"] != 4 and t.params["slub_min_objects"] == 0)
    c = studies.candidate(study, t.number)
    assert [k.knob for k in c.kernel_change] == ["order_objects_mul"]
    note = f"order_objects_mul={t.params['order_objects_mul']}"
    assert note in export.render(c, "grub") and note in export.render(c, "tmpfiles")
    assert any(note in n for n in export.kernel_change_notes(c))
    assert json.loads(export.render(c, "json"))["kernel_change"][0]["knob"] == "order_objects_mul"
    # with slub_min_objects set the heuristic's coefficients are never used: nothing to change
    t = next(t for t in study.trials
             if t.params["order_objects_mul"] != 4 and t.params["slub_min_objects"] > 0)
    assert studies.candidate(study, t.number).kernel_change == ()


def _synthetic(profile: str, boot: dict) -> export.ExportedPolicy:
    return export.ExportedPolicy(study="s", trial=0, profile=profiles.get_profile(profile),
                       memory=0.1, time=10.0,
                       baseline={"memory": 0.2, "time": 12.0}, boot=boot, sysfs={},
                       kernel_change=(), gains={}, params={})


def test_spelling_follows_the_profile_and_ranges_are_checked():
    assert export.render(_synthetic("v6.1", {"slub_max_order": 1}), "cmdline") == \
        "slub_max_order=1\n"
    assert export.render(_synthetic("v7.0", {"slub_max_order": 1}), "cmdline") == \
        "slab_max_order=1\n"
    with pytest.raises(SlabtuneError, match="slub_max_order: 11 is outside 0..10"):
        export.render(_synthetic("v6.18", {"slub_max_order": 11}), "cmdline")
    with pytest.raises(SlabtuneError, match="slub_min_order: 3 is above slub_max_order 1"):
        export.render(_synthetic("v6.1", {"slub_min_order": 3, "slub_max_order": 1}), "grub")
    bad = dataclasses.replace(_synthetic("v6.18", {}), sysfs={"../etc": {"min_partial": 3}})
    with pytest.raises(SlabtuneError, match="sysfs path component"):
        export.render(bad, "tmpfiles")


@pytest.mark.slow
def test_cli_export_and_clean_errors(tmp_path):
    study, url, _runner, front = _front()
    out = tmp_path / "slabtune.conf"
    p = run_cli("export", "--study", "quick", "--storage", url, "--trial", str(front[0]),
                "--format", "tmpfiles", "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert out.read_text().count("w /sys/kernel/slab/") > 0
    p = run_cli("export", "--study", "quick", "--storage", url, "--trial", str(front[0]),
                "--format", "cmdline")
    assert p.returncode == 0, p.stderr
    cand = studies.candidate(study, front[0])
    assert bootparams.parse_cmdline(p.stdout, cand.profile) == \
        bootparams.params_from_validated(cand.boot)
    assert_clean_error(run_cli("export", "--study", "quick", "--storage", url, "--trial", "99999",
                               "--format", "json"), "trial: no trial 99999")
    assert_clean_error(run_cli("export", "--study", "quick", "--storage", url, "--trial", "0",
                               "--format", "json", "--out", str(tmp_path / "no" / "x.json")),
                       "--out")
