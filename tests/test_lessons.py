"""The lessons site: JSON endpoints of a server started in-process on a free port, the widget
registry's invariants, the CLI, and the newer lessons (00, 13's ablation, 23, 24, 27). The Part C
numbers, widget by widget, are in test_lessons_rows.py and test_lessons_rows_systems.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from posttrain import UsageError
from posttrain.lessons import content, pages, registry, server

from lessons_util import floats, kpis

# ---- the endpoints ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site():
    httpd, url = server.start(0)
    yield url
    httpd.shutdown()


def get(url: str):
    with urllib.request.urlopen(url, timeout=60) as res:
        return res.status, res.read().decode()


def test_endpoint_returns_the_advantage_table(site):
    """Row 10: r = (0,0,1), population std → GRPO (−.71, −.71, +1.41), RLOO (−.5, −.5, +1), Dr. GRPO (−.33, −.33, +.67)."""
    status, body = get(site + "api/advantages?r0=0.0&r1=0.0&r2=1.0&std=population")
    k = dict(json.loads(body)["kpis"])
    assert status == 200
    assert (k["mean"], k["std (population)"]) == (0.333, 0.471)
    assert floats(k["GRPO"]) == [-0.71, -0.71, 1.41]
    assert floats(k["RLOO"]) == [-0.5, -0.5, 1.0]
    assert floats(k["Dr. GRPO"]) == [-0.33, -0.33, 0.67]


def test_endpoint_rejects_bad_knobs_with_one_line(site):
    for query in ("advantages?r0=7", "advantages?nope=1", "no_such_widget"):
        with pytest.raises(urllib.error.HTTPError) as e:
            get(site + "api/" + query)
        assert e.value.code == 400
        assert "\n" not in json.loads(e.value.read())["error"]


def test_pages_and_assets_are_served(site):
    assert "six roles" in get(site)[1]
    for ls in content.LESSONS:
        assert f"{ls.number} · " in get(f"{site}lessons/{ls.id}.html")[1]
    assert get(site + "static/plotly.min.js")[1].startswith("/**")  # plotly's own bundle, no CDN
    status, src = get(site + "source/" + pages.source_name("posttrain/algorithms/grpo.py"))
    assert status == 200 and "def advantages" in re.sub("<[^>]+>", "", src)  # tokens are coloured spans


def test_code_links_point_at_the_live_source():
    rel, a, b = pages.code_ref("posttrain.algorithms.grpo:advantages")
    lines = (pages.ROOT / rel).read_text().splitlines()
    assert lines[a - 1].startswith("def advantages(") and b > a
    for ls in content.LESSONS:  # every link of every lesson resolves
        for spec in ls.code:
            pages.code_ref(spec)


# ---- registry invariants -------------------------------------------------------------------------


def test_every_widget_is_on_a_page_documents_a_breaking_setting_and_fits_the_grid():
    ws = registry.load_all()
    on_pages = {n for ls in content.LESSONS for n in ls.widgets}
    assert on_pages <= set(ws)
    for w in ws.values():
        assert w.breaks["what"] and w.breaks["knobs"], w.name
        assert w.grid_size() <= registry.MAX_GRID
        broken = w.parse({k: registry.fmt(v) for k, v in w.breaks["knobs"].items()})  # on the grid
        assert broken != w.defaults(), f"{w.name}: the breaking setting is the default one"


def test_knob_parsing_snaps_inside_the_grid_and_refuses_outside():
    w = registry.get("sync")
    assert w.parse({"sync_every": "7"})["sync_every"] in (6, 8)
    with pytest.raises(UsageError, match="sync_every"):
        w.parse({"sync_every": "400"})


def test_cli_serves_and_prints_its_address():
    env = {**os.environ, "PYTHONPATH": str(pages.ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "posttrain.cli", "lessons", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)
        assert "six roles" in get(url)[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    bad = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "lessons", "--port", "70000"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--port 70000" in bad.stderr


# ---- lessons 00, 13 (ablation), 23, 24, 27 -----------------------------------------------------------


def test_lesson_00_lineage_on_one_group(site):
    """r = (1,0,0,0): mean ¼, unbiased std ½ → GRPO/DAPO (+1.5, −.5…); RLOO 4/3·(r − ¼) = (+1, −⅓…);
    Dr. GRPO r − ¼; REINFORCE A = R; PPO with V = 0 gives A = R, whitened over this one-group batch: GRPO's
    numbers. All equal → only REINFORCE moves."""
    k = dict(json.loads(get(site + "api/lineage?group=1,0,0,0")[1])["kpis"])
    assert floats(k["grpo"]) == floats(k["dapo"]) == [1.5, -0.5, -0.5, -0.5]
    assert floats(k["rloo"]) == [1.0, -0.33, -0.33, -0.33]
    assert floats(k["dr_grpo"]) == [0.75, -0.25, -0.25, -0.25]
    assert floats(k["reinforce"]) == [1.0, 0.0, 0.0, 0.0] and floats(k["ppo"]) == floats(k["grpo"])
    assert "ppo: reference+critic" in k["roles beyond rollout + reward"]
    assert kpis("lineage", group="1,1,1,1")["algorithms with no signal here"] == "ppo, grpo, rloo, dapo, dr_grpo"


def test_row_31_dapo_ablation_recorded_runs(site):
    """Row 31, on our toy: dynamic sampling off leaves ~16% of groups with signal (all on: ~33%, the
    refill cap bounds it) and costs accuracy at equal steps; the refill samples ~3.9× more."""
    k = dict(json.loads(get(site + "api/dapo_ablation?dynamic_sampling=false")[1])["kpis"])
    assert k["all on / all off at step 150"] == "0.850 / 0.676"
    assert k["accuracy at step 30 / 75 / 150"] == "0.407 / 0.558 / 0.672"
    assert k["groups with signal per batch (mean)"] == 0.164 and k["responses sampled in 150 steps"] == 4800
    on = kpis("dapo_ablation")
    assert on["groups with signal per batch (mean)"] == 0.325 and on["responses sampled in 150 steps"] == 18581


def test_dapo_ablation_runs_are_reproducible():
    """The first two recorded points of the all-on run are re-run from scratch (3 seeds, 10 steps)."""
    from posttrain.lessons import dapo_toy, runs

    again = dapo_toy.averaged((True, True, True, True), steps=2 * dapo_toy.EVERY)
    rec = runs.recorded()[dapo_toy.key(True, True, True, True)]
    assert again["acc"] == pytest.approx(rec["acc"][:2], abs=1e-3)
    assert again["samples"] == rec["samples"][:2]
    cfg = dapo_toy.config(False, True, False, True)  # the switches reach dapo.Config
    assert (cfg.eps_high, cfg.aggregation, cfg.overlong_buffer) == (0.2, "seq-mean-token-mean", dapo_toy.BUFFER)


def test_lesson_23_failure_modes_fire_their_alarm(site):
    k = dict(json.loads(get(site + "api/failures?mode=healthy&severity=1.0")[1])["kpis"])
    assert k["alarms fired"] == "none"
    for mode, alarm in [
        ("entropy collapse", "entropy collapse"),
        ("easy prompts", "many degenerate groups"),
        ("reward hacking", "reward up, held-out flat"),
        ("stale sampler", "clip fraction high"),
        ("temperature mismatch", "sampler/trainer mismatch"),
        ("length blow-up", "length blow-up"),
    ]:
        assert kpis("failures", mode=mode, severity=1.0)["alarms fired"] == alarm
    assert kpis("failures", mode="stale sampler", severity=0.0)["alarms fired"] == "none"


def test_lesson_24_sizing_row_84():
    """Row 84: 70B × 18 B ≈ 1.26 TB (1.24 for the 69B preset) > 8 × 80 GB, so colocated on 8 H100 cannot fit."""
    k = kpis("sizing", model="llama-70b", gpus=8, placement="colocated", lora=0)
    assert (
        k["fits?"] == "no" and k["full training state 18 B × P"] == "1.13 TiB vs 596.0 GiB of HBM"
    )  # 1.24 TB vs 640 GB
    small = kpis("sizing")
    # colocated: every phase on all 8 GPUs (the role model's split has 4 a side)
    assert small["fits?"] == "yes" and small["step time (role model)"] == "9.9 s"


def test_lesson_27_truncated_importance_weights(site):
    """On-policy every correction is exact; 16 versions stale, no weight is badly biased, TIS is close."""
    k = dict(json.loads(get(site + "api/off_policy?delta=0&mode=tis&cap=2.0")[1])["kpis"])
    assert k["largest weight"] == 1.0 and k["capped / masked tokens"] == 0.0
    stale = kpis("off_policy", delta=16, mode="none", cap=2.0)
    assert stale["true E_π[f]"] == 0.8753 and stale["bias"] == -0.2987
    tis = kpis("off_policy", delta=16, mode="tis", cap=2.0)
    assert abs(tis["bias"]) < 0.03 and tis["capped / masked tokens"] == 0.193
    assert kpis("off_policy", delta=16, mode="mask", cap=2.0)["capped / masked tokens"] == 0.529


def test_export_without_plotly_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly", None)  # `import plotly` now fails
    with pytest.raises(UsageError, match=r"pip install 'posttrain\[lessons\]'"):
        server.export(tmp_path / "site")
    assert not (tmp_path / "site").exists()


def test_lessons_without_markdown_it_name_the_extra(monkeypatch, capsys):
    from posttrain import cli

    real = cli.importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda m, *a: None if m == "markdown_it" else real(m, *a))
    assert cli.main(["lessons", "--export", "unused"]) == 2
    assert "pip install 'posttrain[lessons]'" in capsys.readouterr().err
