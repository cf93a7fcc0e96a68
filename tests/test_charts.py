"""Charts: valid PNG (magic bytes and a decodable size), HTML with Vega inlined (no CDN),
SVG; order heatmap data against the scalar kernel reference."""

from __future__ import annotations

import struct
import zlib

import polars as pl
import pytest
from _tune_helpers import assert_clean_error, quick_study, run_cli, workdir

from slabtune.errors import SlabtuneError
from slabtune.model import profiles, reference
from slabtune.results import charts, pareto
from slabtune.tuner import objectives

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from the IHDR chunk, checking its CRC."""
    assert data[:8] == PNG_MAGIC
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    body = data[16:29]
    (crc,) = struct.unpack(">I", data[29:33])
    assert zlib.crc32(kind + body) == crc
    w, h = struct.unpack(">II", body[:8])
    assert data.rstrip(b"\x00")[-8:-4] == b"IEND"
    return w, h


def assert_offline_html(text: str) -> None:
    assert "vega-lite" in text.lower() and "vegaEmbed" in text
    assert "cdn.jsdelivr" not in text and "https://cdn" not in text
    assert "<script src=" not in text


@pytest.mark.slow
def test_pareto_chart_png_html_svg(tmp_path):
    study, _url, _runner = quick_study()
    rep = pareto.study_pareto(study)
    chart = charts.pareto_chart(pareto.all_points(study), rep["baseline"])
    png = charts.save(chart, tmp_path / "front.png").read_bytes()
    w, h = png_size(png)
    assert w > 300 and h > 200
    assert_offline_html(charts.save(chart, tmp_path / "front.html").read_text())
    svg = charts.save(chart, tmp_path / "front.svg").read_text()
    assert svg.lstrip().startswith("<svg") and "baseline (default policy)" in svg


@pytest.mark.slow
def test_order_grid_matches_the_reference():
    prof = profiles.get_profile("v6.18")
    cpus, sizes = [1, 4, 64, 1024, 8192], [8, 192, 256, 1024, 4096, 8192]
    params = {"slub_max_order": 2, "slub_min_objects": 0}
    g = objectives.order_grid(prof, params, cpus, sizes)
    for c, s, o, n in zip(g["cpus"], g["size"], g["order"], g["objs_per_slab"]):
        nr = reference.order_nr_cpus(c, c, c, prof, False)
        assert o == reference.slab_order(s, nr, prof, 0, 2, 0), (c, s)
        assert n == reference.objects_per_slab(s, o, prof)
    chart = charts.orders_heatmap(pl.DataFrame(g))
    path = charts.save(chart, workdir() / "orders.png")
    assert png_size(path.read_bytes())[0] > 100


@pytest.mark.slow
def test_fleet_chart_svg(tmp_path):
    study, _url, _runner = quick_study()
    rep = pareto.study_pareto(study)
    trials = [p["trial"] for p in rep["points"][:2]]
    df = charts.gains_frame(rep, trials)
    assert df.height == 2 * len(rep["topologies"]) * 2
    svg = charts.save(charts.fleet_chart(df), tmp_path / "fleet.svg").read_text()
    assert "<svg" in svg and "laptop-8" in svg


def test_bad_chart_suffix():
    with pytest.raises(SlabtuneError, match="unknown chart format"):
        charts.save(charts.orders_heatmap(pl.DataFrame({"cpus": [1], "size": [8], "order": [0]})),
                workdir() / "x.gif")


@pytest.mark.slow
def test_cli_plot_all_three(tmp_path):
    _study, url, _runner = quick_study()
    p = run_cli("plot", "pareto", "--study", "quick", "--storage", url, "--out",
                str(tmp_path / "p.html"))
    assert p.returncode == 0, p.stderr
    assert_offline_html((tmp_path / "p.html").read_text())
    p = run_cli("plot", "orders", "--profile", "v6.1", "--cpus", "1,8,64", "--sizes", "64,4096",
                "--out", str(tmp_path / "o.png"))
    assert p.returncode == 0, p.stderr
    png_size((tmp_path / "o.png").read_bytes())
    p = run_cli("plot", "fleet", "--study", "quick", "--storage", url, "--out",
                str(tmp_path / "f.png"))
    assert p.returncode == 0, p.stderr
    png_size((tmp_path / "f.png").read_bytes())
    assert_clean_error(run_cli("plot", "orders", "--cpus", "0,9", "--out", str(tmp_path / "o.png")),
                       "--cpus")
    assert_clean_error(run_cli("plot", "pareto", "--study", "quick", "--storage", url, "--out",
                               str(tmp_path / "p.jpeg")), "unknown chart format")


@pytest.mark.slow
def test_pareto_chart_marks_each_front_point_by_reach(tmp_path):
    """The front's points carry a shape and colour per reach with a legend; a front that
    mixes reaches shows each (the kernel mark where a point needs a rebuilt kernel)."""
    from slabtune.tuner import study as studies

    study, _url, _runner = quick_study()
    rep = studies.front_report(study)
    pts = pareto.all_points(study, rep["front_reach"])
    front = pts.filter(pl.col("pareto"))
    assert front["reach"].null_count() == 0
    assert set(front["reach"]) <= {"boot", "sysfs", "boot+sysfs", "default"}
    assert pts.filter(~pl.col("pareto"))["reach"].null_count() == pts.height - front.height
    svg = charts.save(charts.pareto_chart(pts, rep["baseline"]), tmp_path / "f.svg").read_text()
    assert f">{charts.REACH_TITLE}<" in svg
    for r in set(front["reach"]):
        assert f">{r} (stock kernel)<" in svg, r
    # a hand-made front with a kernel point: its legend entry and triangle mark are drawn
    mixed = pts.with_columns(pl.when(pl.col("trial") == front["trial"][0]).then(pl.lit("kernel"))
                             .otherwise(pl.col("reach")).alias("reach"))
    spec = charts.pareto_chart(mixed, rep["baseline"]).to_dict()
    layer = next(lyr for lyr in spec["layer"] if lyr.get("encoding", {}).get("shape"))
    scale = layer["encoding"]["shape"]["scale"]
    assert scale["range"][scale["domain"].index("kernel (rebuilt kernel)")] == "triangle-up"
    df = charts.gains_frame(rep, [p["trial"] for p in rep["points"][:2]])
    svg = charts.save(charts.fleet_chart(df), tmp_path / "g.svg").read_text()
    assert f"{rep['points'][0]['trial']} ({rep['points'][0]['reach']})" in svg
