"""`posttrain report RUN_DIR`: one self-contained HTML page about a run (docs/architecture.md §7).

    posttrain report runs/rl            # → runs/rl/report.html, opens offline (plotly.js inlined)

Sections: health alarms, the evaluation table, curves for every metric group (reward/mean's panel
beside eval/pass@1's first, then reward, group, kl, entropy, clip, ratio, grad, length, rollout,
time, staleness, mismatch, eval, then the stage's own groups such as loss, lr, train, pref;
report_plots.py draws them one scale per panel, accuracies on 0–1, series with the same points as
one line named `a = b`), the time per role, and the audited samples
of samples.jsonl with each token coloured by its advantage, logprob or mismatch.

The alarms are pure functions of metric series (`alarms(metrics)`), so they are unit-tested
on synthetic curves; their thresholds are rules of thumb, stated next to each function.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from pathlib import Path

from posttrain import checkpoint
from posttrain.errors import UsageError
from posttrain.eval import SUSPECT
from posttrain.logging import read_jsonl, read_metrics
from posttrain.report_plots import curves, plot
from posttrain.report_samples import PAINT, samples_html

DESIGN_GROUPS = (
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
)  # docs/architecture.md §7, in its order; other groups follow
LEAD = ("reward/mean", "eval/pass@1")  # their panels first, side by side: is the reward rising, and held-out with it?


# ---- health alarms: pure functions of (step, value) series ------------------------------------


@dataclass
class Alarm:
    name: str
    message: str


def _mean(xs) -> float:
    return sum(xs) / len(xs)


def _ends(values: list[float]) -> tuple[float, float]:
    """Means of the first and the last quarter of a series (one point each when short)."""
    w = max(1, len(values) // 4)
    return _mean(values[:w]), _mean(values[-w:])


def reward_up_heldout_flat(
    reward: list[float], heldout: list[float], rise: float = 0.1, flat: float = 0.02
) -> Alarm | None:
    """Train reward rose by ≥ `rise` while held-out pass@1 moved < `flat`: reward hacking or
    memorised train prompts (the study notes' first thing to check)."""
    if len(reward) < 2 or len(heldout) < 2:
        return None
    first, last = _ends(reward)
    if last - first >= rise and heldout[-1] - heldout[0] < flat:
        return Alarm(
            "reward up, held-out flat",
            f"reward/mean rose {first:.3f} → {last:.3f} but eval/pass@1 moved {heldout[0]:.3f} → "
            f"{heldout[-1]:.3f}: read the top-reward samples for reward hacking",
        )
    return None


def entropy_collapse(entropy: list[float], frac: float = 0.1) -> Alarm | None:
    """Token entropy fell below `frac` of its start: exploration is gone, groups turn degenerate."""
    if len(entropy) < 2:
        return None
    first, last = _ends(entropy)
    if first > 0 and last < frac * first:
        return Alarm(
            "entropy collapse",
            f"entropy fell {first:.3f} → {last:.3f} ({last / first:.0%} of the start): "
            "raise the temperature, add an entropy bonus or clip-higher (DAPO)",
        )
    return None


def clip_fraction_high(clip: list[float], limit: float = 0.2) -> Alarm | None:
    """More than `limit` of tokens clipped: each update moves the policy too far (PPO's usual range is < 0.1–0.2)."""
    if not clip:
        return None
    _, last = _ends(clip)
    if last > limit:
        return Alarm(
            "clip fraction high", f"clip/frac is {last:.3f} (> {limit}): lower optim.lr, epochs or minibatches"
        )
    return None


def length_blowup(
    length: list[float], truncated: list[float], growth: float = 2.0, truncated_limit: float = 0.2
) -> Alarm | None:
    """Responses grew `growth`× or more than `truncated_limit` of them hit the cap: the policy
    learns the length budget, not the answer."""
    if len(length) >= 2:
        first, last = _ends(length)
        if first > 0 and last > growth * first:
            return Alarm(
                "length blow-up",
                f"length/mean grew {first:.1f} → {last:.1f} tokens (×{last / first:.1f}): "
                "check truncated samples; consider overlong shaping or a length-neutral loss (Dr. GRPO)",
            )
    if truncated and _ends(truncated)[1] > truncated_limit:
        return Alarm(
            "length blow-up",
            f"length/truncated_frac is {_ends(truncated)[1]:.3f} (> {truncated_limit}): "
            "responses hit max_new_tokens; raise it or penalise overlong responses",
        )
    return None


def mismatch_high(mismatch: list[float], limit: float = 0.05) -> Alarm | None:
    """Sampler and trainer disagree by more than `limit` nats per token: the ratio is off before any
    update (bf16 vs fp32, a different temperature, stale weights)."""
    if not mismatch:
        return None
    peak = max(mismatch)
    if peak > limit:
        return Alarm(
            "sampler/trainer mismatch",
            f"mismatch/logprob_abs reached {peak:.4f} (> {limit}): check the "
            "sampler's temperature and dtype against the trainer's, and that weight sync ran",
        )
    return None


def degenerate_groups(degenerate: list[float], limit: float = 0.6) -> Alarm | None:
    """More than `limit` of groups have equal rewards, so no advantage: most samples teach nothing."""
    if not degenerate:
        return None
    _, last = _ends(degenerate)
    if last > limit:
        return Alarm(
            "many degenerate groups",
            f"{last:.0%} of groups have all-equal rewards (no signal): use "
            "degenerate=resample, more samples_per_prompt, or prompts of fitting difficulty",
        )
    return None


def heldout_accuracy_suspect(metrics: list[dict]) -> Alarm | None:
    """An evaluation found every held-out sample right, or every one wrong, while their rewards
    varied (eval.suspicious_accuracy): its line, from the first evaluation that logged one."""
    for m in metrics:
        line = m.get(SUSPECT)
        if isinstance(line, str):
            return Alarm("held-out accuracy suspicious", f"step {m.get('step', 0)}: {line}")
    return None


def verifier_faults(metrics: list[dict]) -> Alarm | None:
    """Held-out responses the verifier failed to score (it raised, returned garbage, timed out, killed
    its worker): scored 0, they count as wrong answers, so the accuracy is too low. Any is too many."""
    n = {k: sum(series(metrics, f"eval/{k}")) for k in ("errors", "timeouts", "workers_replaced")}
    if not any(n.values()):
        return None
    return Alarm(
        "verifier faults in evaluation",
        f"{n['errors']:g} errors, {n['timeouts']:g} timeouts, {n['workers_replaced']:g} workers replaced "
        "(eval/errors, eval/timeouts, eval/workers_replaced): those responses scored 0, so the verifier, not "
        "the policy, lowered the accuracy; the samples' `error` says why",
    )


def series(metrics: list[dict], key: str) -> list[float]:
    return [float(m[key]) for m in metrics if isinstance(m.get(key), (int, float))]


def alarms(metrics: list[dict]) -> list[Alarm]:
    """Every alarm that fires on a run's metrics (step 0, the starting evaluation, is held-out only)."""
    train = [m for m in metrics if m.get("step", 0) > 0]
    degenerate = series(train, "group/degenerate_frac") or [
        a + b for a, b in zip(series(train, "group/all_pass_frac"), series(train, "group/all_fail_frac"))
    ]
    found = [
        reward_up_heldout_flat(series(train, "reward/mean"), series(metrics, "eval/pass@1")),
        entropy_collapse(series(train, "entropy")),
        clip_fraction_high(series(train, "clip/frac")),
        length_blowup(series(train, "length/mean"), series(train, "length/truncated_frac")),
        mismatch_high(series(train, "mismatch/logprob_abs")),
        degenerate_groups(degenerate),
        heldout_accuracy_suspect(metrics),
        verifier_faults(metrics),
    ]
    return [a for a in found if a is not None]


# ---- the page ----------------------------------------------------------------------------------


def metric_groups(metrics: list[dict]) -> dict[str, list[str]]:
    """group -> its numeric metric keys; the group is the key's prefix before '/' (or the key)."""
    groups: dict[str, list[str]] = {}
    for m in metrics:
        for k, v in m.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                keys = groups.setdefault(k.split("/")[0], [])
                if k not in keys:
                    keys.append(k)
    order = [g for g in DESIGN_GROUPS if g in groups] + sorted(g for g in groups if g not in DESIGN_GROUPS)
    return {g: sorted(groups[g]) for g in order}


def _table(rows: list[list], head: list[str]) -> str:
    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else html.escape(str(v))

    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>" for r in rows)
    return "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + f"</tr>{body}</table>"


def _eval_table(metrics: list[dict]) -> str:
    rows = [m for m in metrics if any(k.startswith("eval/") for k in m)]
    if not rows:
        return "<p>No evaluation in this run.</p>"
    keys = sorted({k for m in rows for k in m if k.startswith("eval/")}, key=lambda k: (k != "eval/pass@1", k))
    return _table([[m["step"], *[m.get(k, "") for k in keys]] for m in rows], ["step", *keys])


def _time_breakdown(metrics: list[dict]) -> str:
    roles = sorted({k for m in metrics for k in m if k.startswith("time/") and k != "time/step_s"})
    if not roles:
        return "<p>No per-role timings in this run.</p>"
    steps = [m for m in metrics if any(r in m for r in roles)]
    traces = [
        {"x": [m["step"] for m in steps], "y": [m.get(r, 0.0) for m in steps], "name": r[5:-2], "type": "bar"}
        for r in roles
    ]
    totals = {r: sum(series(steps, r)) for r in roles}
    step_total = sum(series(steps, "time/step_s")) or sum(totals.values())
    table = _table(
        [[r[5:-2], totals[r], f"{totals[r] / step_total:.1%}"] for r in roles],
        ["role", "total seconds", "share of step time"],
    )
    return plot("plot-time-roles", traces, "seconds per step, by role", barmode="stack") + table


def _throughput(run_dir: Path) -> str:
    """RUN_DIR/throughput.json (distributed/run_summary.py): the equation beside the measured step."""
    path = run_dir / "throughput.json"
    if not path.exists():
        return ""
    t = json.loads(path.read_text())
    head = (
        f"<p>{t['steps']} steps, topology <b>{html.escape(t['topology'])}</b>: measured "
        f"{t['measured_step_s']:.3f} s/step, {t['equation_step_s']:.3f} s by the throughput equation; "
        f"bottleneck <b>{html.escape(t['bottleneck'])}</b>; {t['samples_per_s']:.1f} samples/s; "
        f"trainer idle {t['trainer_idle_frac']:.0%}, rollout idle {t['rollout_idle_frac']:.0%}.</p>"
    )
    roles = _table([[k[:-2], v] for k, v in t["roles_s"].items()], ["role", "mean seconds per step"])
    assumes = t.get("assumes_by_topology", {})  # absent in a throughput.json from before 2026-11-28
    topo = _table(
        [[k, v, assumes.get(k, "")] for k, v in t["equation_by_topology_s"].items()],
        ["topology", "equation s/step, on the same GPUs", "assumes"],
    )
    return head + roles + topo


def _overoptimization(run_dir: Path) -> str:
    """RLHF runs (reward_models/rlhf.write_curve): the proxy and the true reward against √KL, Gao et
    al.'s axes, with the true reward's 5-step running mean and where it peaked."""
    path = run_dir / "overoptimization.json"
    if not path.exists():
        return ""
    data = json.loads(path.read_text())
    rows, turn = data["rows"], data.get("turn", {})
    if not rows:
        return ""
    x = [math.sqrt(max(r.get("seq_kl", r["kl"]), 0.0)) for r in rows]
    smooth = [_mean([r["true"] for r in rows[max(0, i - 4) : i + 1]]) for i in range(len(rows))]
    traces = [
        {"x": x, "y": [r["proxy"] for r in rows], "name": "proxy (RM score)", "type": "scatter", "mode": "markers"},
        {
            "x": x,
            "y": [r["true"] for r in rows],
            "name": "true (verifier)",
            "type": "scatter",
            "mode": "markers",
            "yaxis": "y2",
        },
        {"x": x, "y": smooth, "name": "true, 5-step mean", "type": "scatter", "mode": "lines", "yaxis": "y2"},
    ]
    axes = {
        "xaxis": {"title": {"text": "√KL (per-token k3 × mean length)"}},
        "yaxis": {"title": {"text": "proxy"}},
        "yaxis2": {"title": {"text": "true"}, "overlaying": "y", "side": "right"},
    }
    figure = plot("plot-overoptimization", traces, "over-optimisation: reward against √KL(π ‖ π_ref)", axes=axes)
    note = (
        (
            f"<p>True reward peaked at step {turn['peak_step']} (KL/token {turn['peak_kl']:.3f}, smoothed "
            f"{turn['peak_true_smoothed']:.3f}; start {turn['start_true']:.3f}, end {turn['final_true_smoothed']:.3f}) "
            f"while the proxy went {turn['start_proxy']:.3f} → {turn['final_proxy']:.3f}.</p>"
        )
        if turn
        else ""
    )
    return figure + note


_CSS = """body{font-family:sans-serif;margin:20px;max-width:1200px}table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px;text-align:right}.plot{display:inline-block;width:49%;vertical-align:top}
.alarm{background:#fde2e0;border-left:4px solid #c0392b;padding:6px;margin:4px 0}.ok{background:#e3f6e5;padding:6px}
.sample{margin:8px 0;padding:6px;border:1px solid #ddd}.meta{font-size:12px;color:#555}.tok{white-space:pre}
pre{background:#f6f6f6;padding:8px;font-size:12px}"""


def render(run_dir: str | Path) -> str:
    """The report page of one run directory, as an HTML string."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise UsageError("posttrain report needs plotly: pip install 'posttrain[report]'") from None
    run_dir = Path(run_dir)
    metrics = read_metrics(run_dir)
    if not metrics:
        subs = sorted(p.name for p in run_dir.iterdir() if (p / "metrics.jsonl").exists()) if run_dir.is_dir() else []
        hint = (
            f"give one of its stage directories: {', '.join(subs)}"
            if subs
            else "give a directory a posttrain stage wrote"
        )
        raise UsageError(f"{str(run_dir)!r} holds no metrics.jsonl; {hint}")
    cfg_path = run_dir / "config.yaml"
    config = cfg_path.read_text() if cfg_path.exists() else ""
    last = checkpoint.latest(run_dir)
    meta = json.loads((last / "meta.json").read_text()) if last is not None and (last / "meta.json").exists() else {}
    about = " · ".join(f"{k} {v}" for k, v in meta.items() if k in ("stage", "algorithm", "loss_type", "task"))
    found = alarms(metrics)
    alarm_html = "".join(
        f'<div class="alarm"><b>{html.escape(a.name)}</b>: {html.escape(a.message)}</div>' for a in found
    ) or (
        '<div class="ok">No alarm: reward vs held-out, entropy, clip fraction, '
        "length, mismatch, degenerate groups and verifier faults look healthy.</div>"
    )
    groups = metric_groups(metrics)
    sections = [
        f"<h1>posttrain run report: {html.escape(str(run_dir))}</h1>",
        f"<p>{len(metrics)} logged steps (last step {metrics[-1]['step']}) · {html.escape(about)}</p>",
        f'<h2 id="alarms">Health alarms</h2>{alarm_html}',
        f'<h2 id="eval">Evaluation</h2>{_eval_table(metrics)}',
        f'<h2 id="curves">Metric curves</h2>{"".join(curves(metrics, groups, lead=LEAD))}',
        *(
            [f'<h2 id="overoptimization">Reward-model over-optimisation</h2>{_overoptimization(run_dir)}']
            if (run_dir / "overoptimization.json").exists()
            else []
        ),
        f'<h2 id="time">Time per role</h2>{_time_breakdown(metrics)}{_throughput(run_dir)}',
        f'<h2 id="samples">Audited samples</h2>{samples_html(read_jsonl(run_dir / "samples.jsonl"))}',
        f'<h2 id="config">Config</h2><pre>{html.escape(config)}</pre>',
    ]
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>posttrain report</title><style>{_CSS}</style>'
        f"<script>{get_plotlyjs()}</script></head><body>{''.join(sections)}<script>{PAINT}</script></body></html>"
    )


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    path = Path(out) if out else Path(run_dir, "report.html")
    path.write_text(render(run_dir), encoding="utf-8")
    return path
