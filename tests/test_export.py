"""Export: command lines that parse back to the trial's values, GRUB drop-ins, tmpfiles.d
lines, JSON reports; kernel-change knobs listed; bad trials and values fail cleanly."""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import pytest
from _tune_helpers import KERNEL_SPEC as HELPERS_KERNEL_SPEC
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


#: _tune_helpers.KERNEL_SPEC with a min_partial knob too
KERNEL_SPEC = HELPERS_KERNEL_SPEC + 'min_partial_lo = { low = 0, high = 10 }\n'


@functools.cache
def _kernel_study():
    """Three policies of a study that opted in to kernel knobs: the order heuristic's
    coefficient alone, the same with slub_min_objects set (calculate_order() then never
    reads the coefficient), and a min_partial clamp with the coefficient."""
    spec = studies.parse_spec(KERNEL_SPEC, "kspec")
    runner, _ = studies.create_or_resume(spec, "kexport", "memory:")
    policies = [{"slub_min_objects": 0, "order_objects_mul": 7, "min_partial_lo": 5},
                {"slub_min_objects": 16, "order_objects_mul": 7, "min_partial_lo": 5},
                {"slub_min_objects": 0, "order_objects_mul": 4, "min_partial_lo": 8}]
    runner.record(policies, runner.evaluator.evaluate(policies))
    return runner.study


@pytest.mark.slow
def test_kernel_change_knobs_are_listed_never_dropped():
    study = _kernel_study()
    c = studies.candidate(study, 0)
    assert [k.knob for k in c.kernel_change] == ["order_objects_mul"] and c.reach == "kernel"
    note = "order_objects_mul=7"
    assert note in export.render(c, "grub") and note in export.render(c, "tmpfiles")
    assert any(note in n for n in export.kernel_change_notes(c))
    rep = json.loads(export.render(c, "json"))
    assert rep["kernel_change"][0]["knob"] == "order_objects_mul" and rep["reach"] == "kernel"
    assert "# reach: kernel (needs a rebuilt kernel" in export.render(c, "grub")
    # with slub_min_objects set the heuristic's coefficients are never used: nothing to change
    c = studies.candidate(study, 1)
    assert c.kernel_change == () and c.reach == "boot"
    assert "# reach: boot (boot parameters only" in export.render(c, "tmpfiles")
    # min_partial_lo 8 lifts kmalloc-64's clamp(ilog2(64) / 2, 5, 10) = 5: a sysfs write
    c = studies.candidate(study, 2)
    assert c.reach == "sysfs" and c.sysfs["kmalloc-64"]["min_partial"] == 8
    assert "# reach: sysfs" in export.render(c, "tmpfiles")


@pytest.mark.slow
def test_export_header_reach_matches_the_pareto_report():
    study, _url, _runner, _front_ = _front()
    rep = studies.front_report(study)
    for p in rep["points"][:4]:
        c = studies.candidate(study, p["trial"])
        assert c.reach == p["reach"] != "kernel"
        lines = export.render(c, "grub").splitlines()
        assert lines[1] == f"# reach: {export.REACH_TEXT[c.reach]}"


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


# --------------------------------------------------------------------------- injection

EVIL = ('x\nGRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX init=/bin/sh"\n'
        'w /etc/shadow - - - - root::0:0:99999:7:::\r\n"\'; $(reboot) `id` | & > /tmp/x #')
_TOKEN = re.compile(r"slab_(min_order|max_order|min_objects)=\d+|slab_nomerge")
_TMPFILES = re.compile(r"w /sys/kernel/slab/[\w.-]+/(min_partial|cpu_partial) - - - - \d+")


def assert_only_expected_lines(fmt: str, text: str) -> None:
    """Every line an export holds is a comment or the one active form of its format."""
    lines = text.splitlines()
    assert text.endswith("\n") and "\r" not in text
    if fmt == "cmdline":
        assert len(lines) == 1 and all(_TOKEN.fullmatch(t) for t in lines[0].split())
    elif fmt == "grub":
        active = [ln for ln in lines if not ln.startswith("#")]
        assert len(active) <= 1
        for ln in active:
            m = re.fullmatch(r'GRUB_CMDLINE_LINUX_DEFAULT="\$GRUB_CMDLINE_LINUX_DEFAULT (.*)"', ln)
            assert m and all(_TOKEN.fullmatch(t) for t in m.group(1).split()), ln
    elif fmt == "tmpfiles":
        assert all(ln.startswith("#") or _TMPFILES.fullmatch(ln) for ln in lines), text
    else:
        json.loads(text)
    for ln in lines:
        assert ln.isprintable() and ln.isascii(), ln


def _run_dir(tmp_path, name: str):
    """A tune run directory with a real Optuna SQLite study.db (8 tune_quick trials)."""
    _study, _url, runner = quick_study()
    run = tmp_path / name
    r, url = studies.create_or_resume(runner.spec, name, None, run, evaluator=runner.evaluator)
    r.run(8, 8)
    return run, run / studies.DB_NAME


def _sql(db, query: str, *args) -> None:
    import sqlite3

    con = sqlite3.connect(db)
    with con:
        assert con.execute(query, args).rowcount >= 1, query
    con.close()


@pytest.mark.slow
def test_a_study_name_with_newlines_never_reaches_an_exported_file(tmp_path):
    """issue 33: a run directory whose study.db names its study with newlines, quotes and
    shell metacharacters; --run reads the name from the database.  Every format is refused
    with one line naming the study's name, and nothing is written."""
    run, db = _run_dir(tmp_path, "inj")
    _sql(db, "UPDATE studies SET study_name = ?", EVIL)
    with pytest.raises(SlabtuneError) as err:
        studies.load_study(None, None, run)
    assert "\n" not in str(err.value) and "study name stored in" in str(err.value)
    for fmt in ("grub", "tmpfiles"):
        out = tmp_path / f"out.{fmt}"
        assert_clean_error(run_cli("export", "--run", str(run), "--trial", "0", "--format", fmt,
                                   "--out", str(out)), "study: the study name stored in")
        assert not out.exists()
    assert_clean_error(run_cli("pareto", "--run", str(run)), "study: the study name stored in")


@pytest.mark.slow
def test_tampered_params_and_attrs_are_refused_or_stay_data(tmp_path):
    """A param name with a newline is refused naming the trial; newlines, quotes and shell
    metacharacters in the study's topology names and spec name stay data: every format
    holds only its expected lines (JSON escapes them)."""
    run, db = _run_dir(tmp_path, "inj2")
    _sql(db, "UPDATE trial_params SET param_name = ? WHERE trial_id = "
             "(SELECT MIN(trial_id) FROM trials) AND param_name = 'slub_max_order'", EVIL)
    first = 0   # the lowest trial_id of a fresh database is trial 0
    with pytest.raises(SlabtuneError) as err:   # refused on reading the study or the trial
        studies.candidate(studies.load_study(None, None, run), first)
    msg = str(err.value)
    assert msg.startswith(f"trial {first}: param ") and "\n" not in msg
    _sql(db, "UPDATE trial_params SET param_name = 'slub_max_order' WHERE param_name = ?", EVIL)
    topos = json.dumps([EVIL + str(i) for i in range(4)])
    _sql(db, "UPDATE study_user_attributes SET value_json = ? WHERE key = ?", topos,
         studies.ATTR_TOPOLOGIES)
    _sql(db, "UPDATE study_user_attributes SET value_json = ? WHERE key = ?",
         json.dumps(EVIL), "slabtune_spec_name")
    study = studies.load_study(None, None, run)
    for t in study.trials:
        c = studies.candidate(study, t.number)
        for fmt in ("cmdline", "grub", "tmpfiles", "json"):
            text = export.render(c, fmt)
            assert_only_expected_lines(fmt, text)
            if fmt == "json":
                assert EVIL + "0" in json.loads(text)["gains"]


def test_one_line_escapes_every_control_character():
    s = export.one_line(EVIL + "\u2028\x1b[2J\t\x00")
    assert s.isprintable() and s.isascii() and "\n" not in s
    assert s.startswith("x\\nGRUB_CMDLINE_LINUX=") and "\\u2028\\x1b[2J\\t\\x00" in s
    assert export.one_line("a" * 300).endswith("...") and len(export.one_line("a" * 300)) == 203
    c = dataclasses.replace(_synthetic("v6.18", {"slub_max_order": 1}), study=EVIL)
    for fmt in export.FORMATS[:4]:
        with pytest.raises(SlabtuneError, match=r"^study: name .* is not one printable line$"):
            export.render(c, fmt)
