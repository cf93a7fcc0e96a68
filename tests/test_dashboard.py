"""A slabtune study opens in optuna-dashboard unchanged (issue 5) and the dashboard shows
the front ``slabtune pareto`` prints (issue 34): a real ``slabtune tune`` study in SQLite,
served by optuna-dashboard's own WSGI app on 127.0.0.1, read through its JSON API, its
server-side Pareto-front plot, and the Pareto-front code of its own JavaScript bundle (run
with node where node is installed)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import threading
import urllib.request
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

import optuna
import optuna_dashboard
import pytest
from _tune_helpers import run_cli

from slabtune.tuner import constraints, study


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):  # keep the test output clean
        pass


def _get(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as r:
        assert r.status == 200
        return json.loads(r.read())


@pytest.mark.slow
def test_tune_study_is_served_by_optuna_dashboard(tmp_path):
    proc = run_cli("tune", "tune_quick", "--trials", "12", "--batch", "6", "--study", "dash",
                   "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    url = json.loads(proc.stdout)["storage"]
    assert url == f"sqlite:///{tmp_path / 'runs' / 'dash' / 'study.db'}"
    stock = optuna.load_study(study_name="dash", storage=url)   # what we compare against
    spec = study.load_spec("tune_quick")

    server = make_server("127.0.0.1", 0, optuna_dashboard.wsgi(url), handler_class=_Quiet)
    port = server.server_port
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        studies = _get(port, "/api/studies")["study_summaries"]
        (summary,) = [s for s in studies if s["study_name"] == "dash"]
        assert summary["directions"] == ["minimize", "minimize"]
        attrs = {a["key"]: a["value"] for a in summary["user_attrs"]}
        assert attrs[study.ATTR_PROFILE] == "v6.18"
        assert json.loads(attrs[study.ATTR_TOPOLOGIES]) == list(spec.fleet.topology_names)

        detail = _get(port, f"/api/studies/{summary['study_id']}")
        assert detail["name"] == "dash"
        assert detail["directions"] == ["minimize", "minimize"]
        assert detail["objective_names"] == ["memory", "time"]
        trials = detail["trials"]
        assert len(trials) == 12
        assert {p["name"] for p in detail["intersection_search_space"]} == set(spec.space.names)
        assert detail["best_trials"]
        by_number = {t.number: t for t in stock.trials}
        for t in trials:
            ref = by_number[t["number"]]
            assert t["state"] == "Complete"
            assert t["values"] == ref.values
            params = {p["name"]: p["param_external_value"] for p in t["params"]}
            assert params == {k: str(v) for k, v in ref.params.items()}
            uattrs = {a["key"]: json.loads(a["value"]) for a in t["user_attrs"]}
            assert uattrs[study.ATTR_TOPO] == ref.user_attrs[study.ATTR_TOPO]
            assert len(uattrs[study.ATTR_TOPO]["memory"]) == len(spec.fleet.topologies)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextlib.contextmanager
def _dashboard(url: str):
    """optuna-dashboard's WSGI app on a free port of 127.0.0.1; yields the port."""
    server = make_server("127.0.0.1", 0, optuna_dashboard.wsgi(url), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


#: The dashboard's own Pareto-front code (optuna-dashboard 0.21, public/bundle.js): ``sv``
#: (a complete trial with all its values), ``hv`` (feasible: every served constraint <= 0)
#: and ``pv`` (which of the feasible points another dominates), as its Pareto-front plot
#: calls them: the "Best Trial" points are the feasible ones ``pv`` leaves undominated.
_BUNDLE_PARTS = {
    "sv": r'sv=\(e,t\)=>"Complete"===e\.state&&void 0!==e\.values&&e\.values\.length===t\.length',
    "pv": r"pv=e=>0===e\.length\?\[\]:.*?(?=;function hv\()",
    "hv": r"function hv\(e,t\)\{.*?return\{feasibleTrials:n,infeasibleTrials:i\}\}",
}
_FRONT_JS = """
const d = JSON.parse(require("fs").readFileSync(0, "utf8"));
const u = hv(d.trials, d).feasibleTrials;
const p = u.map(t => t.values.map((v, k) => d.directions[k] === "minimize" ? v : -v));
const h = pv(p);
console.log(JSON.stringify(u.filter((t, k) => !h[k]).map(t => t.number)));
"""


def _bundle_front(detail: dict) -> list[int] | None:
    """The trial numbers the dashboard's Pareto-front plot marks "Best Trial" for the study
    ``detail`` (its /api/studies/ID answer), computed by the bundle's own functions under
    node; None without node."""
    node = shutil.which("node")
    if node is None:
        return None
    bundle = (Path(optuna_dashboard.__file__).parent / "public" / "bundle.js").read_text()
    code = []
    for name, pattern in _BUNDLE_PARTS.items():
        m = re.search(pattern, bundle)
        assert m, f"optuna-dashboard {optuna_dashboard.__version__}: no {name} in bundle.js"
        code.append(("const " if name != "hv" else "") + m.group(0) + ";")
    proc = subprocess.run([node, "-e", "\n".join(code) + _FRONT_JS], input=json.dumps(detail),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _plot_traces(fig: dict) -> dict[str, set[int]]:
    """Trial numbers per trace of optuna.visualization.plot_pareto_front's figure, by the
    label of its hover template ("Best Trial", "Infeasible Trial", ...)."""
    out: dict[str, set[int]] = {}
    for trace in fig["data"]:
        label = re.search(r"<extra>(.*)</extra>", trace["hovertemplate"]).group(1)
        out[label] = {json.loads(t.replace("<br>", "\n"))["number"] for t in trace["text"]}
    return out


@pytest.mark.slow
def test_optuna_dashboard_shows_the_front_slabtune_pareto_prints(tmp_path):
    """tune_quick (max_regression 0.25) leaves trials that regress a topology too far; the
    dashboard reads their constraint, so its Pareto-front plots (the bundle's and the
    server-side one) hold exactly the trials on slabtune's front, folded ones included."""
    proc = run_cli("tune", "tune_quick", "--trials", "128", "--batch", "32", "--study", "front",
                   "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    url = f"sqlite:///{tmp_path / 'runs' / 'front' / 'study.db'}"
    par = run_cli("pareto", "--study", "front", "--json", cwd=tmp_path)
    assert par.returncode == 0, par.stderr
    points = json.loads(par.stdout)["points"]
    front = {p["trial"] for p in points} | {t for p in points for t in p["same_as"]}
    stock = optuna.load_study(study_name="front", storage=url)
    complete = {t.number: t for t in stock.get_trials(
        states=(optuna.trial.TrialState.COMPLETE,))}
    infeasible = {n for n, t in complete.items() if not constraints.feasible(t)}
    assert infeasible and front and not front & infeasible

    with _dashboard(url) as port:
        (summary,) = [s for s in _get(port, "/api/studies")["study_summaries"]
                      if s["study_name"] == "front"]
        sid = summary["study_id"]
        detail = _get(port, f"/api/studies/{sid}")
        fig = _get(port, f"/api/studies/{sid}/plot/pareto_front")

    # every served trial carries its constraint, as Optuna reads it
    served = {t["number"]: t for t in detail["trials"]}
    assert set(served) == set(complete)
    for n, t in served.items():
        assert t["constraints"] == list(complete[n].constraints.values()), n
        assert (max(t["constraints"]) > 0) == (n in infeasible)
        assert t["values"] == complete[n].values
    for p in points:                          # the objectives pareto printed, as served
        assert served[p["trial"]]["values"] == [p["memory"], p["time"]]

    traces = _plot_traces(fig)                # Optuna's plot, served by the dashboard
    assert traces["Best Trial"] == front
    assert traces["Infeasible Trial"] == infeasible
    in_bundle = _bundle_front(detail)         # the plot the dashboard draws in the browser
    if in_bundle is not None:
        assert set(in_bundle) == front and len(in_bundle) == len(front)

    # The "Best Trials" list of optuna-dashboard 0.21 ignores constraints (its
    # _pareto_front.get_pareto_front_trials): what it adds to the front is infeasible, and
    # here it adds some (docs/TUNING.md, "optuna-dashboard")
    best = {t["number"] for t in detail["best_trials"]}
    assert front - best <= {n for n in front if any(
        _dominates(complete[m].values, complete[n].values) for m in infeasible)}
    assert best - front and best - front <= infeasible


def _dominates(a, b) -> bool:
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))
