"""A slabtune study opens in optuna-dashboard unchanged (issue 5): a real ``slabtune tune``
study in SQLite, served by optuna-dashboard's own WSGI app on 127.0.0.1, read through its
JSON API."""

from __future__ import annotations

import json
import threading
import urllib.request
from wsgiref.simple_server import WSGIRequestHandler, make_server

import optuna
import optuna_dashboard
import pytest
from _tune_helpers import run_cli

from slabtune.tuner import study


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
