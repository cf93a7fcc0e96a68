"""Charts with altair: the Pareto front with the baseline marked, an order heatmap over CPU
counts x object sizes, and per-topology gains of chosen policies.

Charts take plain polars frames or dicts (the tuner or the store produce them; this module
never imports JAX).  :func:`save` picks the format by suffix: ``.html`` embeds Vega, Vega-Lite
and vega-embed in the file (``inline=True``) so it opens offline; ``.png`` and ``.svg`` are
rendered by vl-convert.
"""

from __future__ import annotations

import io
from pathlib import Path

import altair as alt
import polars as pl

from slabtune.errors import SlabtuneError
from slabtune.results.safeio import check_output, write_atomic

FORMATS = (".html", ".png", ".svg")


#: Marks of the front's points by reach (what deploying each takes), in legend order.
REACH_MARKS = {
    "default": ("circle", "#7f7f7f"),
    "boot": ("circle", "#1f77b4"),
    "sysfs": ("square", "#2ca02c"),
    "slabinfo": ("square", "#2ca02c"),
    "boot+sysfs": ("diamond", "#17becf"),
    "boot+slabinfo": ("diamond", "#17becf"),
    "kernel": ("triangle-up", "#d62728"),
}
#: Legend title of the reach marks.
REACH_TITLE = "reach"


def reach_label(reach: str) -> str:
    """A reach as the legend shows it: whether a stock kernel takes it."""
    return f"{reach} (rebuilt kernel)" if reach == "kernel" else f"{reach} (stock kernel)"


def pareto_chart(points: pl.DataFrame, baseline: dict, title: str = "Pareto front") -> alt.Chart:
    """All trials (feasible and not), the non-dominated ones joined by a step line, and the
    baseline policy as a labelled cross.  ``points`` has columns trial, memory, time,
    feasible, pareto and optionally reach (slabtune.tuner.study.front_report): the front's
    points are then drawn with a shape and colour per reach, with a legend."""
    df = points.with_columns(
        pl.when(pl.col("pareto")).then(pl.lit("Pareto front"))
        .when(pl.col("feasible")).then(pl.lit("feasible"))
        .otherwise(pl.lit("regresses a topology")).alias("kind"))
    x = alt.X("memory:Q", title="memory overhead (overhead bytes / live bytes)",
              scale=alt.Scale(zero=False))
    y = alt.Y("time:Q", title="modelled time per op (ns)", scale=alt.Scale(zero=False))
    color = alt.Color("kind:N", title=None,
                      scale=alt.Scale(domain=["Pareto front", "feasible", "regresses a topology"],
                                      range=["#1f77b4", "#aaaaaa", "#e4b0b0"]))
    cloud = alt.Chart(df).mark_circle(size=28, opacity=0.7).encode(
        x=x, y=y, color=color, tooltip=["trial:Q", "memory:Q", "time:Q", "kind:N"])
    front = alt.Chart(df.filter(pl.col("pareto")).sort("memory")).mark_line(
        interpolate="step-after", color="#1f77b4").encode(x=x, y=y)
    base = pl.DataFrame({"memory": [float(baseline["memory"])],
                         "time": [float(baseline["time"])], "label": ["baseline (default policy)"]})
    bmark = alt.Chart(base).mark_point(shape="cross", size=220, color="#d62728",
                                       filled=True).encode(
        x=x, y=y, tooltip=["label:N", "memory:Q", "time:Q"])
    btext = alt.Chart(base).mark_text(align="left", dx=10, dy=-8, color="#d62728").encode(
        x=x, y=y, text="label:N")
    layers = cloud + front
    if "reach" in df.columns and df.filter(pl.col("pareto") & pl.col("reach").is_not_null()
                                           ).height:
        marked = df.filter(pl.col("pareto") & pl.col("reach").is_not_null())
        present = [r for r in REACH_MARKS if r in set(marked["reach"].to_list())]
        present += sorted(set(marked["reach"].to_list()) - set(present))
        marked = marked.with_columns(pl.col("reach").map_elements(
            reach_label, return_dtype=pl.Utf8).alias("deploy"))
        labels = [reach_label(r) for r in present]
        legend = alt.Legend(title=REACH_TITLE, labelLimit=400)
        shape = alt.Shape("deploy:N", legend=legend, scale=alt.Scale(
            domain=labels, range=[REACH_MARKS.get(r, ("cross", ""))[0] for r in present]))
        rcolor = alt.Color("deploy:N", legend=legend, scale=alt.Scale(
            domain=labels, range=[REACH_MARKS.get(r, ("", "#000000"))[1] for r in present]))
        layers = layers + alt.Chart(marked).mark_point(size=90, filled=True).encode(
            x=x, y=y, shape=shape, color=rcolor,
            tooltip=["trial:Q", "memory:Q", "time:Q", "reach:N"])
    return (layers + bmark + btext).resolve_scale(color="independent", shape="independent"
                                                  ).properties(title=title, width=520,
                                                               height=360)


def orders_heatmap(grid: pl.DataFrame, title: str = "slab order") -> alt.Chart:
    """Slab order of each (CPU count, object size) cell; ``grid`` has columns cpus, size,
    order (and optionally objs_per_slab for the tooltip)."""
    tooltip = ["cpus:O", "size:O", "order:Q"] + (
        ["objs_per_slab:Q"] if "objs_per_slab" in grid.columns else [])
    base = alt.Chart(grid).encode(
        x=alt.X("cpus:O", title="CPUs", sort="ascending"),
        y=alt.Y("size:O", title="object size (bytes)", sort="descending"))
    rect = base.mark_rect().encode(
        color=alt.Color("order:O", title="order", scale=alt.Scale(scheme="viridis")),
        tooltip=tooltip)
    text = base.mark_text(fontSize=9).encode(text="order:Q", color=alt.value("white"))
    return (rect + text).properties(title=title, width=max(240, 22 * grid["cpus"].n_unique()),
                                    height=max(160, 18 * grid["size"].n_unique()))


def fleet_chart(gains: pl.DataFrame, title: str = "gain against the baseline per topology"
                ) -> alt.Chart:
    """Per-topology gains: ``gains`` has columns trial, topology, objective (memory | time)
    and gain (fraction, positive = better than the baseline)."""
    label = pl.col("trial").cast(pl.Utf8)
    if "reach" in gains.columns:
        label = pl.concat_str([label, pl.lit(" ("), pl.col("reach").fill_null("?"),
                               pl.lit(")")])
    df = gains.with_columns((pl.col("gain") * 100).alias("gain_pct"),
                            label.alias("trial_label"))
    return alt.Chart(df).mark_bar().encode(
        x=alt.X("topology:N", title=None),
        xOffset=alt.XOffset("trial_label:N"),
        y=alt.Y("gain_pct:Q", title="gain over baseline (%)"),
        color=alt.Color("trial_label:N", title="trial"),
        column=alt.Column("objective:N", title=None),
        tooltip=["trial_label:N", "topology:N", "objective:N",
                 alt.Tooltip("gain_pct:Q", format=".2f")],
    ).properties(title=title, width=260, height=240)


def gains_frame(report: dict, trials: list[int] | None = None) -> pl.DataFrame:
    """Long frame of per-topology gains of Pareto points (all, or the trials named) from a
    :func:`slabtune.results.pareto.study_pareto` report, with each point's reach (null
    when the report has none)."""
    rows = []
    for p in report["points"]:
        if trials is not None and p["trial"] not in trials:
            continue
        for topo, g in p["gains"].items():
            for obj in ("memory", "time"):
                rows.append({"trial": p["trial"], "topology": topo, "objective": obj,
                             "gain": float(g[obj]), "reach": p.get("reach")})
    return pl.DataFrame(rows, schema={"trial": pl.Int64, "topology": pl.Utf8,
                                      "objective": pl.Utf8, "gain": pl.Float64,
                                      "reach": pl.Utf8})


def save(chart: alt.TopLevelMixin, out: str | Path) -> Path:
    """Write a chart by suffix: HTML with Vega inlined, or PNG/SVG via vl-convert."""
    path = Path(out)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise SlabtuneError(f"out: {out}: unknown chart format {suffix or '(none)'!r} "
                            f"(use {', '.join(FORMATS)})")
    if not path.parent.is_dir():
        raise SlabtuneError(f"out: directory {path.parent} does not exist")
    check_output(path, "out")                 # before rendering: a device or link is refused
    buf = io.BytesIO() if suffix == ".png" else io.StringIO()
    chart.save(buf, format=suffix[1:], **({"inline": True} if suffix == ".html" else {}))
    return write_atomic(path, buf.getvalue(), "out")
