"""What a validation run stores: the targets, the row schema, row builders, and the manifest's
task table.

One row per measured quantity, the model's prediction beside the measurement (DESIGN.md
section 6); a failed task leaves one ``status = "failed"`` row with its error and console
tail. docs/VALIDATION.md describes the method.
"""


from __future__ import annotations

import json

import polars as pl

from slabtune.kernel.check import COMPARED_FIELDS
from slabtune.kernel.guest import CONSOLE_TAIL_CHARS

#: Every target, in the order tasks are planned.
TARGETS: tuple[str, ...] = ("guest", "host", "native", "lab", "uml")
#: Attempts beyond the first Ray makes for a task whose worker died or raised OSError.
MAX_RETRIES = 2
#: The custom Ray resource guest tasks ask for (a node with qemu and a kernel to boot).
QEMU_RESOURCE = "qemu"
BASELINE_ID = "baseline"
#: Structural fields compared (same as ``kernel check``).
STRUCTURAL_FIELDS = COMPARED_FIELDS
MEMORY_FIELD = "slab_bytes"
COST_FIELD = "cost"
TASK_FIELD = "task"
#: Row columns of a validation run, in order.
ROW_SCHEMA: dict[str, pl.DataType] = {
    "task": pl.Int64, "candidate": pl.String, "params": pl.String, "applied": pl.String,
    "topology": pl.String, "target": pl.String, "status": pl.String,
    "accelerator": pl.String, "kernel_release": pl.String, "profile": pl.String,
    "cache": pl.String, "field": pl.String, "predicted": pl.Float64, "measured": pl.Float64,
    "unit": pl.String, "comparable": pl.Boolean, "note": pl.String, "attempts": pl.Int64,
    "seconds": pl.Float64, "error": pl.String, "console_tail": pl.String,
    # lab rows: the lab kernel (scripts/build-kernels.sh name) and the config's hash
    "kernel": pl.String, "config_hash": pl.String,
}

# --------------------------------------------------------------------------- rows


def row(task: dict, **kw) -> dict:
    base = {k: None for k in ROW_SCHEMA}
    c = task["candidate"]
    base.update(task=task["index"], candidate=c["id"],
                params=json.dumps({**c["boot"], **c["knobs"]}, sort_keys=True),
                topology=task["topology"], target=task["target"], status="ok")
    base.update(kw)
    return base


def frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=ROW_SCHEMA, orient="row") if rows else pl.DataFrame(
        schema=ROW_SCHEMA)


def failed_rows(task: dict, error: str, console_tail: str = "", attempts: int | None = None,
                seconds: float | None = None, accelerator: str | None = None) -> list[dict]:
    """The one row a failed task leaves."""
    return [row(task, status="failed", field=TASK_FIELD, error=error or "failed",
                 console_tail=(console_tail or "")[-CONSOLE_TAIL_CHARS:], attempts=attempts,
                 seconds=seconds, accelerator=accelerator, comparable=False)]


def is_validate_run(run) -> bool:
    return run.manifest.get("kind") == "validate"


def task_table(run) -> list[dict]:
    """One entry per task from the manifest (state, status, error)."""
    out = []
    plan = run.manifest["spec"].get("plan") or []
    for i in range(run.n_chunks):
        st = run.manifest["chunks"]["states"].get(str(i), {})
        cand, topo, target = plan[i] if i < len(plan) else ("?", "?", "?")
        out.append({"task": i, "state": st.get("state", "pending"),
                    "status": st.get("status") or "pending",
                    "candidate": st.get("candidate", cand), "topology": st.get("topology", topo),
                    "target": st.get("target", target), "error": st.get("error")})
    return out
