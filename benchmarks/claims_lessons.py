"""The recorded data behind the lesson widgets of issue 22's claims, distilled from the results JSON.

    python benchmarks/claims_lessons.py      # → posttrain/lessons/data/claims.json

One key per claim, each naming the widget (posttrain/lessons/widgets_*.py) that should read it and
the results file it comes from; only the numbers a widget draws are kept (curves averaged over
seeds, histograms summed), so the package ships a few kB, not the raw runs. A claim whose results
file is missing is left out.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "posttrain" / "lessons" / "data" / "claims.json"


def _load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def _mean_curves(curves: list[list[float]]) -> list[float]:
    n = min(len(c) for c in curves)
    return [round(statistics.fmean(c[i] for c in curves if c[i] == c[i]), 4) for i in range(n)]


def length_bias() -> dict | None:
    rows = (_load("claims.json") or {}).get("length_budget")
    if not rows:
        return None
    out = {"widget": "length_bias", "source": "benchmarks/results/claims.json (length_budget)", "algorithms": {}}
    for algo in sorted({r["algorithm"] for r in rows}):
        rs = [r for r in rows if r["algorithm"] == algo]
        out["algorithms"][algo] = {
            "seeds": sorted(r["seed"] for r in rs),
            "max_new_tokens": rs[0]["max_new_tokens"],
            "wrong_length_first10": round(statistics.fmean(r["length/wrong_mean_first10"] for r in rs), 2),
            "wrong_length_last10": round(statistics.fmean(r["length/wrong_mean_last10"] for r in rs), 2),
            "wrong_excess_start": round(statistics.fmean(r["excess_start"]["wrong_excess"] for r in rs), 2),
            "wrong_excess_end": round(statistics.fmean(r["excess_end"]["wrong_excess"] for r in rs), 2),
            "pass@1_start": round(statistics.fmean(r["pass@1_start"] for r in rs), 4),
            "pass@1_end": round(statistics.fmean(r["pass@1_end"] for r in rs), 4),
        }
    return out


def overoptimization() -> dict | None:
    res = _load("overoptimization.json")
    if not res:
        return None
    out = {
        "widget": "hacking",
        "source": "benchmarks/results/overoptimization.json",
        "seeds": sorted(b["seed"] for b in res.get("bon", [])),
        "rm_heldout_pair_acc": {Path(rm).name: v["heldout_pair_acc"] for rm, v in res["bon"][0]["rms"].items()}
        if res.get("bon")
        else {},
        "best_of_n": {Path(rm).name: curve for rm, curve in res.get("bon_summary", {}).items()},
        "rl": {},
    }
    key_of = lambda r: (r["rm"], r["kl_coef"], r.get("lr", 1e-4))  # rows before --lr ran at rlhf.yaml's 1e-4
    for key in sorted({key_of(r) for r in res.get("rl", [])}):
        rs = [r for r in res["rl"] if key_of(r) == key]
        n = min(len(r["curve"]) for r in rs)
        mean = lambda k, i, rs=rs: statistics.fmean(r["curve"][i][k] for r in rs)
        out["rl"][f"{Path(key[0]).name} kl={key[1]} lr={key[2]:g}"] = {
            "seeds": sorted(r["seed"] for r in rs),
            "step": [rs[0]["curve"][i]["step"] for i in range(n)],
            "sqrt_kl": [round(max(mean("seq_kl", i), 0.0) ** 0.5, 4) for i in range(n)],
            "true": [round(mean("true", i), 4) for i in range(n)],
            "proxy": [round(mean("proxy", i), 4) for i in range(n)],
        }
    return out


def prm() -> dict | None:
    res = _load("prm.json")
    if not res:
        return None
    runs = res["runs"]
    return {
        "widget": "prm",
        "source": "benchmarks/results/prm.json",
        "seeds": sorted(r["seed"] for r in runs),
        "accuracy": {k: round(v["mean"], 4) for k, v in res["summary"].items()},
        "tokens_per_problem": runs[0]["tokens_per_problem"],
        "step_accuracy": {
            "prm_steps": [c["prm_steps"] for c in runs[0]["prm_curve"]],
            "heldout": _mean_curves([[c["step_acc"] for c in r["prm_curve"]] for r in runs]),
            "majority": round(statistics.fmean(r["prm_best"]["step_majority"] for r in runs), 4),
        },
        "ranking": {
            how: {
                k: round(statistics.fmean(r["ranking"][how][k] for r in ranked), 4)
                for k in ("within_auc", "across_auc", "corr_with_steps")
            }
            for how in ("min", "last")
        }
        if (ranked := [r for r in runs if "ranking" in r])
        else None,
    }


def precision() -> dict | None:
    res = _load("precision.json")
    if not res:
        return None
    out = {"widget": "off_policy", "source": "benchmarks/results/precision.json", "mismatch": {}}
    for fmt in ("fp32", "bf16", "fp16"):
        rs = [r for r in res.get("mismatch", {}).get("rows", []) if r["format"] == fmt]
        if not rs:
            continue
        counts = [
            sum(r["log10_abs_delta_hist"]["counts"][i] for r in rs)
            for i in range(len(rs[0]["log10_abs_delta_hist"]["counts"]))
        ]
        out["mismatch"][fmt] = {
            "log10_abs_delta_edges": rs[0]["log10_abs_delta_hist"]["edges"],
            "counts": counts,
            **{
                k: statistics.fmean(r[k] for r in rs)
                for k in (
                    "delta_abs_mean",
                    "delta_abs_max",
                    "seq_log_ratio_std",
                    "clip_frac_eps0.2",
                    "tis_capped_frac",
                    "mask_dropped_frac",
                )
            },
        }
    if "learning" in res:
        out["learning"] = [{k: v for k, v in r.items() if not k.endswith("_std")} for r in res["learning"]["summary"]]
    if "invariance" in res:
        out["invariance"] = res["invariance"]["rows"]
    return out


def group_size() -> dict | None:
    rows = (_load("claims.json") or {}).get("group")
    if not rows:
        return None
    return {
        "widget": "grpo_group",
        "source": "benchmarks/results/claims.json (group)",
        "runs": [
            {
                "run": r["run"],
                "seed": r["seed"],
                "pass@1_start": r["pass@1_start"],
                "pass@1_end": r["pass@1_end"],
                "degenerate_first10": r["group/degenerate_frac_first10"],
                "degenerate_last10": r["group/degenerate_frac_last10"],
            }
            for r in rows
        ],
    }


def main() -> None:
    parts = {
        "length_bias": length_bias(),
        "overoptimization": overoptimization(),
        "prm": prm(),
        "precision": precision(),
        "group_size": group_size(),
    }
    data = {k: v for k, v in parts.items() if v is not None}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT}: {', '.join(data)}")


if __name__ == "__main__":
    main()
