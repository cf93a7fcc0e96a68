"""The package layout's rules, read from the source: data flows one way between packages
(README.md, "How data flows"), the model imports nothing else of the project, and the
native C sources are package data found without a source checkout."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Source folder of each installed subpackage (pyproject.toml's package-dir).
PACKAGES = {"model": "model", "sweeps": "sweeps", "tuner": "tuner", "results": "results",
            "kernel": "kernel", "validate": "validate", "calibrate": "calibrate",
            "native": "native", "cli": "slabtune"}
#: What each package may import of the project.  ``errors`` is the tiny shared error
#: module; ``native`` only locates the packaged C sources.
ALLOWED = {
    "model": {"errors"},
    "native": set(),
    "results": {"errors", "model"},
    "kernel": {"errors", "model", "native", "results"},
    "sweeps": {"errors", "model", "native", "results"},
    "tuner": {"errors", "model", "results", "sweeps"},
    "calibrate": {"errors", "model", "sweeps", "results"},
    "validate": {"errors", "model", "results", "sweeps", "kernel", "native", "tuner",
                 "calibrate"},
    "cli": (set(PACKAGES) - {"cli"}) | {"errors"},
}


def _target(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "slabtune" or len(parts) < 2:
        return None
    if parts[1] == "errors":
        return "errors"
    if parts[1] in ("cli", "commands", "__main__"):
        return "cli"
    return parts[1] if parts[1] in PACKAGES else None


def import_edges() -> dict[str, set[tuple[str, str]]]:
    """package -> {(imported package, file)} over every import statement, function-local
    ones included."""
    edges: dict[str, set[tuple[str, str]]] = {p: set() for p in PACKAGES}
    for pkg, folder in PACKAGES.items():
        for f in (ROOT / folder).rglob("*.py"):
            if pkg == "cli" and f.name == "errors.py":
                continue
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                for n in names:
                    t = _target(n)
                    if t is not None and t != pkg:
                        edges[pkg].add((t, str(f.relative_to(ROOT))))
    return edges


def test_packages_import_only_downward():
    bad = sorted((pkg, t, f) for pkg, es in import_edges().items() for t, f in es
                 if t not in ALLOWED[pkg])
    assert bad == []


def test_the_allowed_graph_has_no_cycle():
    seen: dict[str, int] = {}

    def visit(p: str) -> None:
        assert seen.get(p) != 1, f"cycle through {p}"
        if seen.get(p) == 2:
            return
        seen[p] = 1
        for q in ALLOWED.get(p, ()):
            if q in ALLOWED:
                visit(q)
        seen[p] = 2

    for p in ALLOWED:
        visit(p)


def test_the_rule_is_not_vacuous():
    """The walker sees imports: tuner uses sweeps and validate uses tuner today."""
    edges = import_edges()
    assert "sweeps" in {t for t, _ in edges["tuner"]}
    assert "tuner" in {t for t, _ in edges["validate"]}


def test_native_sources_are_package_data_and_build_into_the_cache(tmp_path, monkeypatch):
    from slabtune import native
    from slabtune.validate import native as native_driver

    for name in ("slubsim.c", "workload.c", "dynsim.c", "slabdyn.c", "engine.h"):
        assert native.source(name).is_file()
    text = (ROOT / "pyproject.toml").read_text()
    assert '"slabtune.native" = ["*.c", "*.h", "Makefile", "lab/*.c", "lab/Kbuild"]' in text
    if not os.environ.get("PATH") or not any(
            (Path(d) / "gcc").exists() for d in os.environ["PATH"].split(os.pathsep)):
        pytest.skip("gcc is not installed")
    monkeypatch.setenv("SLABTUNE_CACHE", str(tmp_path))
    binary = native_driver.build()
    assert binary == tmp_path / "build" / "slubsim" and binary.is_file()
    assert not (ROOT / "native" / "build" / "slubsim.tmp").exists()
