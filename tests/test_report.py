"""The run report: health alarms on synthetic curves, the page's sections, and a headless
Chromium render that checks every plot drew."""

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from posttrain import cli, report
from posttrain.report import (
    alarms,
    clip_fraction_high,
    degenerate_groups,
    entropy_collapse,
    length_blowup,
    metric_groups,
    mismatch_high,
    reward_up_heldout_flat,
)
from posttrain.report_plots import panels

# ---- alarms: each fires on its bad curve and stays silent on a healthy one -----------------------


def test_reward_up_while_heldout_flat():
    rising = [0.2] * 4 + [0.5] * 4  # first/last quarter means 0.2 → 0.5
    a = reward_up_heldout_flat(rising, [0.30, 0.31, 0.30])
    assert a.message == (
        "reward/mean rose 0.200 → 0.500 but eval/pass@1 moved 0.300 → 0.300: "
        "read the top-reward samples for reward hacking"
    )
    assert reward_up_heldout_flat(rising, [0.30, 0.35, 0.40]) is None  # held-out follows
    assert reward_up_heldout_flat([0.2] * 8, [0.3, 0.3]) is None  # reward flat too
    assert reward_up_heldout_flat(rising, [0.3]) is None  # one eval: no trend


def test_entropy_collapse():
    a = entropy_collapse([2.0, 2.0, 1.0, 0.5, 0.3, 0.1, 0.1, 0.1])
    assert a.message.startswith("entropy fell 2.000 → 0.100 (5% of the start)")
    assert entropy_collapse([2.0, 1.8, 1.5, 1.2]) is None  # 60% left: fine
    assert entropy_collapse([0.0, 0.0]) is None


def test_clip_fraction_high():
    assert clip_fraction_high([0.05, 0.1, 0.3, 0.35]).message.startswith("clip/frac is 0.350 (> 0.2)")
    assert clip_fraction_high([0.05, 0.1, 0.12, 0.1]) is None


def test_length_blowup():
    grown = length_blowup([20, 20, 30, 50, 60, 70, 80, 90], [0.0] * 8)
    assert grown.message.startswith("length/mean grew 20.0 → 85.0 tokens (×4.2)")
    capped = length_blowup([20, 21, 20, 22], [0.0, 0.1, 0.3, 0.4])
    assert capped.message.startswith("length/truncated_frac is 0.400 (> 0.2)")
    assert length_blowup([20, 25, 30, 35], [0.0, 0.0, 0.05, 0.1]) is None


def test_mismatch_high():
    assert mismatch_high([1e-6, 2e-6, 0.08, 1e-6]).message.startswith("mismatch/logprob_abs reached 0.0800 (> 0.05)")
    assert mismatch_high([1e-6, 0.01, 0.02]) is None


def test_many_degenerate_groups():
    assert degenerate_groups([0.2, 0.5, 0.7, 0.9]).message.startswith("90% of groups have all-equal rewards")
    assert degenerate_groups([0.2, 0.3, 0.4, 0.5]) is None


def test_alarms_read_the_metric_names_and_skip_the_starting_evaluation():
    metrics = [{"step": 0, "eval/pass@1": 0.3}]
    metrics += [
        {
            "step": s,
            "reward/mean": 0.2 if s <= 4 else 0.6,
            "entropy": 1.0,
            "clip/frac": 0.01,
            "length/mean": 20.0,
            "length/truncated_frac": 0.0,
            "mismatch/logprob_abs": 1e-6,
            "group/all_pass_frac": 0.5,
            "group/all_fail_frac": 0.3,
        }
        for s in range(1, 9)
    ]
    metrics[-1]["eval/pass@1"] = 0.3
    assert [a.name for a in alarms(metrics)] == ["reward up, held-out flat", "many degenerate groups"]
    for m in metrics[1:]:
        m["group/all_pass_frac"] = 0.1  # 0.1 + 0.3 degenerate: fine
    metrics[-1]["eval/pass@1"] = 0.5
    assert alarms(metrics) == []


def test_a_suspicious_heldout_accuracy_is_an_alarm_with_the_evaluations_line():
    line = "held-out accuracy is 0 on all 10 samples while their rewards vary (0 to 0.1): ... '1 2 3'"
    metrics = [{"step": 0, "eval/pass@1": 0.0, "alarm/heldout_accuracy": line}, {"step": 1, "reward/mean": 0.1}]
    assert [(a.name, a.message) for a in alarms(metrics)] == [("held-out accuracy suspicious", f"step 0: {line}")]
    assert alarms([{"step": 0, "eval/pass@1": 0.0}, {"step": 1, "reward/mean": 0.1}]) == []


# ---- the page -----------------------------------------------------------------------------------


def synthetic_run(root, steps=12):
    """A run directory with every RL metric of docs/architecture.md §7, evaluations and audited samples."""
    root.mkdir(parents=True, exist_ok=True)
    rows = [{"step": 0, "eval/pass@1": 0.3, "eval/pass@8": 0.6}]
    for s in range(1, steps + 1):
        rows.append(
            {
                "step": s,
                "reward/mean": 0.3 + 0.02 * s,
                "reward/std": 0.4,
                "group/all_pass_frac": 0.1,
                "group/all_fail_frac": 0.2,
                "kl/ref": 0.001 * s,
                "entropy": 1.0 - 0.01 * s,
                "clip/frac": 0.01,
                "ratio/mean": 1.0,
                "ratio/max": 1.1,
                "grad/norm": 0.5,
                "length/mean": 30.0,
                "length/truncated_frac": 0.0,
                "rollout/tokens_per_s": 15000.0 + 100 * s,
                "rollout/samples": 128.0,
                "rollout/prefills": 16.0,
                "time/rollout_s": 1.0,
                "time/train_s": 0.5,
                "time/sync_s": 0.01,
                "time/step_s": 1.6,
                "staleness/mean": 0.5,
                "mismatch/logprob_abs": 1e-6,
                "loss": math.nan if s == 3 else 0.1,
                "lr": 3e-5,
            }
        )
        if s % 6 == 0:
            rows[-1].update({"eval/pass@1": 0.3 + 0.02 * s, "eval/pass@8": 0.7, "eval/length_mean": 28.0 - 0.1 * s})
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sample = {
        "step": 6,
        "selection": "top",
        "policy_version": 5,
        "prompt": "<1+2>",
        "response": "3</s>#",
        "response_tokens": ["3", "<", "/s>", "#"],
        "behaviour_logprobs": [-0.1, -2.0, -0.3, -0.01],
        "trainer_logprobs": [-0.1, -2.0, -0.3, -0.01],
        "ref_logprobs": [-0.2, -1.0, -0.3, -0.02],
        "advantages": [0.7] * 4,
        "advantage": 0.7,
        "reward": 1.0,
        "components": {"correct": 1.0},
        "finish_reason": "stop",
        "error": None,
    }
    (root / "samples.jsonl").write_text(json.dumps(sample) + "\n" + json.dumps({**sample, "step": 12}) + "\n")
    (root / "config.yaml").write_text("algorithm: grpo\nsteps: 12\n")
    return root


DESIGN_GROUPS = [
    "reward",
    "group",
    "kl",
    "entropy",
    "clip",
    "ratio",
    "grad",
    "length",
    "rollout",
    "time",
    "staleness",
    "mismatch",
    "eval",
]


def test_page_has_every_section_and_a_plot_per_panel_of_each_metric_group(tmp_path):
    run = synthetic_run(tmp_path / "run")
    groups = metric_groups(json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())
    assert list(groups) == DESIGN_GROUPS + ["loss", "lr"]
    assert groups["eval"] == ["eval/length_mean", "eval/pass@1", "eval/pass@8"]
    page = report.render(run)
    assert re.findall(r'<h2 id="(\w+)"', page) == ["alarms", "eval", "curves", "time", "samples", "config"]
    # reward/mean's panel beside eval/pass@1's, then every group's other panels in order
    panels = ["reward", "eval", *DESIGN_GROUPS[1:8], "length-2", "rollout", "rollout-2", "time", "time-2"]
    panels += [*DESIGN_GROUPS[10:12], "eval-2"]
    assert re.findall(r'<div class="plot" id="plot-([\w-]+)"', page) == panels + ["loss", "lr", "time-roles"]
    assert "<script src=" not in page and "<link" not in page  # nothing fetched
    assert page.count('class="tok"') == 8 and ">/s&gt;</span>" in page  # escaped tokens
    assert "<td>rollout</td><td>12</td><td>62.5%</td>" in page  # 12 s of 19.2 s
    assert '<div class="ok">No alarm' in page


def test_a_group_is_cut_into_panels_of_one_unit_and_scale():
    """Accuracies and fractions on their own 0–1 axes; the rest by unit, cut where the typical
    value jumps more than ten times; all-zero series beside values of at most 1, else alone."""
    values = {
        "eval/pass@1": [0.3, 0.8],
        "eval/greedy_acc": [0.5, 0.9],
        "eval/length_mean": [28.0, 29.0],
        "eval/reward_mean": [0.4, 0.6],
        "eval/errors": [0.0, 0.0],
        "rollout/tokens_per_s": [15000.0, 16000.0],
        "rollout/samples": [128.0, 128.0],
        "rollout/prefills": [16.0, 16.0],
        "rollout/slot_occupancy": [0.7, 0.9],
        "rollout/cancelled": [0.0, 0.0],
        "time/rollout_s": [2.0, 3.0],
    }
    assert panels(list(values), values) == [
        (["eval/pass@1", "eval/greedy_acc"], "accuracy"),
        (["rollout/slot_occupancy"], "fraction"),
        (["eval/errors", "rollout/cancelled", "eval/reward_mean"], "other"),  # 0 beside 0.5
        (["rollout/prefills", "eval/length_mean", "rollout/samples"], "other"),  # 16 to 128: within 10×
        (["rollout/tokens_per_s"], "rate"),
        (["time/rollout_s"], "seconds"),
    ]
    big = {"rollout/samples": [128.0], "rollout/cancelled": [0.0]}
    assert panels(list(big), big) == [(["rollout/cancelled"], "other"), (["rollout/samples"], "other")]


def _figures(page: str) -> dict[str, dict]:
    specs = re.findall(r'<div class="plot" id="([\w-]+)"></div><script>\(function\(\)\{var s=(.*?);Plotly', page)
    return {div: json.loads(spec.replace("<\\/", "</")) for div, spec in specs}


def test_series_with_the_same_points_are_one_line_named_for_each(tmp_path):
    """One reward function with weight 1: reward/correct is reward/mean; errors and timeouts stay
    0. Drawn as five lines, two would hide under the others; drawn as three, each says what it is."""
    rows = [
        {"step": s, "reward/mean": r, "reward/correct": r, "reward/std": 0.4, "reward/errors": 0.0}
        | {"reward/timeouts": 0.0, "eval/pass@1": 0.2 + r / 2}
        for s, r in enumerate([0.1, 0.3, 0.2, 0.5])
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = _figures(report.render(tmp_path))
    assert list(figures)[:2] == ["plot-reward", "plot-eval"]  # the page opens with these two, side by side
    lines = {t["name"]: t["y"] for t in figures["plot-reward"]["data"]}
    assert lines == {"errors = timeouts": [0.0] * 4, "correct = mean": [0.1, 0.3, 0.2, 0.5], "std": [0.4] * 4}
    assert figures["plot-reward"]["layout"]["showlegend"]


def test_the_lead_panels_come_first_and_keep_their_names():
    from posttrain.report_plots import curves

    rows = [{"step": 1, "loss": 0.5, "reward/mean": 0.2, "eval/pass@1": 0.3, "eval/length_mean": 30.0}]
    groups = {"loss": ["loss"], "reward": ["reward/mean"], "eval": ["eval/length_mean", "eval/pass@1"]}
    ids = [re.search(r'id="([\w-]+)"', f)[1] for f in curves(rows, groups, lead=("reward/mean", "eval/pass@1"))]
    assert ids == ["plot-reward", "plot-eval", "plot-loss", "plot-eval-2"]
    assert [re.search(r'id="([\w-]+)"', f)[1] for f in curves(rows, groups)] == [
        "plot-loss",
        "plot-reward",
        "plot-eval",
        "plot-eval-2",
    ]


def test_page_shows_the_throughput_equation_when_the_run_wrote_one(tmp_path):
    from posttrain.distributed.run_summary import write_summary

    run = synthetic_run(tmp_path / "run")
    assert "by the throughput equation" not in report.render(run)  # no throughput.json: no section
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    s = write_summary(run, rows, "colocated", samples_per_step=64)
    page = report.render(run)
    assert f"measured {s['measured_step_s']:.3f} s/step" in page and f"bottleneck <b>{s['bottleneck']}</b>" in page
    assert page.count("<td>colocated</td>") == 1 and "<td>async</td>" in page
    assert "<td>samples one version stale; the two pools overlap; sync paid at every step boundary</td>" in page


def test_an_rlhf_run_gets_its_reward_against_root_kl_plot(tmp_path):
    from posttrain.reward_models.rlhf import write_curve

    run = synthetic_run(tmp_path / "run")
    assert "overoptimization" not in report.render(run)  # no RM: no section
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for m in rows[1:]:  # true rises to step 4, then falls
        s = m["step"]
        m.update({"reward/proxy": 0.1 * s, "reward/true": 0.5 + 0.05 * min(s, 4) - 0.05 * max(s - 4, 0)})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    turn = write_curve(run)
    page = report.render(run)
    assert re.findall(r'<h2 id="(\w+)"', page)[3] == "overoptimization"
    spec = json.loads(
        re.search(r'id="plot-overoptimization"></div><script>\(function\(\)\{var s=(.*?);Plotly', page).group(1)
    )
    x = spec["data"][0]["x"]  # √(per-token KL × 30 tokens)
    assert x[:2] == pytest.approx([math.sqrt(0.001 * 30), math.sqrt(0.002 * 30)])
    assert spec["data"][1]["y"][3] == pytest.approx(0.7) and spec["layout"]["yaxis2"]["overlaying"] == "y"
    assert f"peaked at step {turn['peak_step']}" in page and turn["peak_step"] == 6  # 5-step mean peaks later


def test_cli_report_writes_the_file_and_rejects_a_directory_without_metrics(tmp_path, capsys):
    run = synthetic_run(tmp_path / "pipe" / "rl")
    assert cli.main(["report", str(run)]) == 0
    assert (run / "report.html").stat().st_size > 1_000_000  # plotly.js is inlined
    assert cli.main(["report", str(tmp_path / "pipe")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"posttrain report: error: '{tmp_path / 'pipe'}' holds no metrics.jsonl; give one of its stage directories: rl"
    )


def _chromium():
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("POSTTRAIN_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is not installed; .ci/run installs it with apt-get install -y chromium")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return path


def _headless(tmp_path, *args):
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--virtual-time-budget=20000",
    ]
    return subprocess.run([_chromium(), *flags, *args], capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_report_renders_in_headless_chromium_with_every_plot_drawn(tmp_path):
    from PIL import Image

    run = synthetic_run(tmp_path / "run")
    page = report.write_report(run)
    expected = len(re.findall(r'<div class="plot" id=', page.read_text()))
    dom = _headless(tmp_path, "--dump-dom", page.as_uri()).stdout
    drawn = re.findall(r'<div class="plot js-plotly-plot" id="([\w-]+)"', dom)  # Plotly.newPlot ran
    assert len(drawn) == expected == 20
    assert dom.count('class="main-svg"') >= 2 * expected  # each plot has its SVG layers
    assert len(re.findall(r'class="tok"[^>]*style="background: rgb\(40, 160, 60\)', dom)) == 8  # painted by advantage
    shot = tmp_path / "report.png"
    _headless(tmp_path, "--window-size=1280,3000", f"--screenshot={shot}", page.as_uri())
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 3000)
    colours = image.getcolors(maxcolors=1 << 20)
    assert len(colours) > 50  # not a blank page
    _figures_read_at_a_glance(page, Path(os.environ.get("POSTTRAIN_SCREENSHOTS", tmp_path)))


# What each drawn figure shows, read from plotly's own state: its y range and, per trace, the median |y|.
FIGURE_STATE = """(el) => ({range: el._fullLayout.yaxis.range,
  scales: el.data.map(t => { const m = t.y.map(Math.abs).sort((a, b) => a - b); return m[m.length >> 1]; })})"""


def _figures_read_at_a_glance(page, shots):
    """Every figure in the browser (playwright): no legend, title or tick labels over another part
    or out of the figure (lessons_browser_checks.FIGURE_CHECK), accuracies on 0–1, one scale per
    axis; the page's screenshot is saved for a look."""
    from playwright.sync_api import sync_playwright

    from lessons_browser_checks import FIGURE_CHECK

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox", "--disable-gpu"])
        tab = browser.new_page(viewport={"width": 1280, "height": 900})
        tab.goto(page.as_uri())
        tab.wait_for_function("document.querySelectorAll('.plot .main-svg').length >= 40")
        problems = {}
        for el in tab.query_selector_all(".plot"):
            found = el.evaluate(FIGURE_CHECK)
            if found:
                problems[el.get_attribute("id")] = found
        state = {el.get_attribute("id"): el.evaluate(FIGURE_STATE) for el in tab.query_selector_all(".plot")}
        tab.screenshot(path=str(shots / "report.png"), full_page=True)
        browser.close()
    assert problems == {}
    assert state["plot-eval"]["range"] == [-0.02, 1.02] and state["plot-group"]["range"] == [-0.02, 1.02]
    assert state["plot-eval-2"]["scales"] == [pytest.approx(27.4)]  # eval/length_mean (26.8, 27.4), alone
    del state["plot-time-roles"]  # stacked bars: the parts of one total
    for div, figure in state.items():  # counts, tokens/s and seconds never share an axis across decades
        scales = [x for x in figure["scales"] if x > 0]
        assert not scales or max(scales) <= 10 * min(scales), (div, figure["scales"])
