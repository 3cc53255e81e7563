"""Every widget's documented breaking setting breaks, numerically: one test per widget compares
the KPIs at the breaking knobs with those at the defaults (or with a healthy setting) and checks
the failure the widget's `breaks["what"]` describes. The last test checks that every widget in
the registry has its test here."""

from __future__ import annotations

import sys

import pytest

from posttrain.lessons import registry

from lessons_util import floats, kpis


def broken(name: str) -> dict:
    """KPIs at the widget's documented breaking setting."""
    return kpis(name, **registry.get(name).breaks["knobs"])


def pct(text: str) -> float:
    return float(str(text).rstrip("%"))


# ---- part I --------------------------------------------------------------------------------------


def test_break_bandit():
    ok, bad = kpis("bandit"), broken("bandit")
    assert ok["seeds ending on a wrong arm"] <= 0.01 and bad["seeds ending on a wrong arm"] >= 0.05


def test_break_sampler():
    ok, bad = kpis("sampler"), broken("sampler")
    assert bad["P(degenerate group), measured"] > 0.85 and ok["P(degenerate group), measured"] < 0.5


def test_break_beta():
    ok, bad = kpis("beta"), broken("beta")
    assert ok["reward-hacked (θ > 5)?"] == "no" and ok["final θ"] < 5
    assert bad["reward-hacked (θ > 5)?"] == "yes" and bad["final θ"] == 10.0 and bad["final KL"] == 100.0
    # the flag and the number agree everywhere on the grid (θ = 4.73 once said "yes")
    for beta in registry.get("beta").knobs[0].values:
        k = kpis("beta", beta=beta, schedule="fixed")
        assert (k["reward-hacked (θ > 5)?"] == "yes") == (k["final θ"] > 5)


def test_break_kl():
    ok, bad = kpis("kl"), broken("kl")
    assert abs(ok["k3 mean"] - ok["exact KL"]) < 0.2 * ok["exact KL"]
    assert abs(bad["k3 mean"] - bad["exact KL"]) > 2 * bad["exact KL"] and bad["k1 mean"] < 0


def test_break_verifier():
    assert kpis("verifier", response="12#")["reward"] == 1.0
    bad = broken("verifier")
    assert bad["reward"] == 0.0 and bad["extracted answer"] == 13


def test_break_advantages():
    bad = broken("advantages")
    assert bad["degenerate (all equal)?"].startswith("yes")
    assert floats(bad["GRPO"]) == floats(bad["RLOO"]) == floats(bad["Dr. GRPO"]) == [0.0, 0.0, 0.0]
    assert floats(bad["REINFORCE (A = r)"]) == [1.0, 1.0, 1.0]


def test_break_loss_assembly():
    ok, bad = kpis("loss_assembly"), broken("loss_assembly")
    assert ok["clip/frac (gradient zeroed)"] == 0.0 and ok["ρ outside [1−ε, 1+ε]"] == 0.0
    assert bad["ρ outside [1−ε, 1+ε]"] == 1.0 and bad["clip/frac (gradient zeroed)"] == 0.5


def test_break_controller():
    ok, bad = kpis("controller", phase=5), broken("controller")
    assert (
        ok["degenerate (dropped under skip / resample)?"] == "no"
        and bad["degenerate (dropped under skip / resample)?"] == "yes"
    )
    assert floats(bad["advantages (population std)"]) == [0.0, 0.0, 0.0]
    assert floats(kpis("controller", phase=6, answers="12, 12, 12")["Δ log π(y) of the trainer"]) == [0.0, 0.0, 0.0]


def test_break_tool_mask():
    ok, bad = kpis("tool_mask"), broken("tool_mask")
    assert ok["tool tokens in the loss"] == 0 and bad["tool tokens in the loss"] == bad["tool tokens"] == 6


# ---- part II -------------------------------------------------------------------------------------


def test_break_grpo_group():
    bad = broken("grpo_group")
    assert bad["degenerate?"].startswith("yes") and floats(bad["A"]) == [0.0] * 4


def test_break_rloo():
    bad = broken("rloo")
    assert bad["measured A_RLOO / A_centred"] == "— (degenerate)" and bad["mean reward"] == 1.0


def test_break_dapo():
    ok, bad = kpis("dapo"), broken("dapo")
    assert bad["useful groups"] < 0.05 and ok["useful groups"] > 0.3


def test_break_dapo_ablation():
    ok, bad = kpis("dapo_ablation"), broken("dapo_ablation")
    assert bad["groups with signal per batch (mean)"] < 0.2 < ok["groups with signal per batch (mean)"]
    final = lambda k: float(k["accuracy at step 30 / 75 / 150"].split(" / ")[-1])
    assert final(ok) - final(bad) > 0.1


def test_break_length_bias():
    bad = broken("length_bias")
    short, long = (float(x) for x in bad["GRPO (÷|y_i|, mean over seqs): short / long"].split(" / "))
    assert long / short < 0.005  # a long answer's token gets < 0.5%
    s2, l2 = (float(x) for x in bad["DAPO (÷Σ|y_i|): short / long"].split(" / "))
    assert s2 == l2


def test_break_bt_rm():
    ok, bad = kpis("bt_rm"), broken("bt_rm")
    label = "whole ranking right, share of 200 runs"
    assert pct(ok[label]) - pct(bad[label]) > 20


def test_break_dpo4():
    ok, bad = kpis("dpo4"), broken("dpo4")
    assert floats(ok["final π"])[3] == max(floats(ok["final π"]))  # the best answer wins
    pi = floats(bad["final π"])
    assert pi[1] > 0.9 and pi[3] < 0.1  # a mediocre answer wins instead
    first, last = (float(x) for x in bad["log π(chosen), first → last 50 pairs"].split(" → "))
    assert last < first - 2


def test_break_pref_curves():
    ok, bad = kpis("pref_curves"), broken("pref_curves")
    assert bad["IPO minimum at h = 1/(2β)"] == 10.0 and ok["IPO minimum at h = 1/(2β)"] == 1.0
    assert bad["hinge is 0 beyond h = 1/β"] == 20.0


def test_break_prm():
    ok, bad = kpis("prm"), broken("prm")
    methods = ("one sample (pass@1)", "majority of N", "ORM best of N", "PRM best of N", "PRM beam")
    assert max(pct(ok[m]) for m in methods) > 90
    assert max(pct(bad[m]) for m in methods) < 10  # nothing can pick what was never sampled


def test_break_hacking():
    ok, bad = kpis("hacking"), broken("hacking")
    assert ok["π(solve)"] > 0.75 and abs(ok["train reward EMA"] - ok["held-out correctness EMA"]) < 0.05
    assert bad["π(solve)"] < 0.1 and bad["train reward EMA"] - bad["held-out correctness EMA"] > 0.4
    note = registry.compute("hacking")["note"]
    assert "move together" in note  # the default does not claim a divergence


# ---- gpt_mini track --------------------------------------------------------------------------------


def test_break_next_char():
    ok, bad = kpis("next_char"), broken("next_char")
    assert (
        bad["entropy H of the sampled distribution (nats)"] > ok["entropy H of the sampled distribution (nats)"] + 0.3
    )
    right = "share of samples that are the right next char"
    assert ok[right] > 0.99 and bad[right] < 0.92  # 3+4= → 7: wrong digits at T = 2
    greedy = kpis("next_char", temperature=0.0)
    assert greedy["entropy H of the sampled distribution (nats)"] == 0.0 and greedy["perplexity e^H"] == 1.0


def test_break_grpo_sim():
    """G06: K = 2 has not converged by step 40 where K = 8 has (P(correct) ≥ 0.9)."""
    ok, bad = kpis("grpo_sim"), broken("grpo_sim")
    assert ok["P(correct) at step 40"] >= 0.9 and bad["P(correct) at step 40"] < 0.7
    assert bad["groups with no signal, steps 1–40"] > 0.6 and ok["groups with no signal, steps 1–40"] < 0.3
    assert bad["first step with P(correct) ≥ 0.9"] > 2 * ok["first step with P(correct) ≥ 0.9"]


def test_break_curation():
    ok, bad = kpis("curation"), broken("curation")
    assert pct(ok["rollouts in groups with no signal"]) < 10 and pct(bad["rollouts in groups with no signal"]) > 35
    assert bad["expected gradient per 100 rollouts"] < 0.6 * ok["expected gradient per 100 rollouts"]


def test_break_clip():
    ok, bad = kpis("clip"), broken("clip")
    assert ok["gradient"] == "flows" and ok["∂loss/∂log π"] != 0 and ok["tokens with a gradient, epoch 3"] > 0.3
    assert bad["gradient"] == "killed (clipped)" and bad["∂loss/∂log π"] == 0.0
    assert bad["tokens with a gradient, epoch 3"] == 0.0  # the later epochs learn nothing
    assert bad["reward gained over the epochs"] < 0.6 * ok["reward gained over the epochs"]


def test_break_cot():
    """G04, recorded runs: six terms answered directly by the 2-layer model are mostly wrong where the
    same model with the trace gets most right; direct accuracy falls with K, CoT's stays high."""
    ok, bad = kpis("cot"), broken("cot")
    assert ok["held-out accuracy (this setting)"] > 0.7 and bad["held-out accuracy (this setting)"] < 0.2
    direct, cot = (
        floats(ok[k].replace(" → ", ",")) for k in ("direct answers, K = 2 → 6", "chain of thought, K = 2 → 6")
    )
    assert all(c > d + 0.4 for c, d in zip(cot, direct))
    assert direct[-1] < direct[0]


def test_break_sft_mask():
    """G03, recorded runs (3 seeds): trained on the prompt, the model answers about half as many
    held-out 4–5-term sums at step 200 as with the prompt masked, and is still behind at 400."""
    ok, bad = kpis("sft_mask"), broken("sft_mask")
    assert (
        bad["held-out accuracy at step 200 (this setting)"] < 0.6 * ok["held-out accuracy at step 200 (this setting)"]
    )
    assert bad["held-out accuracy at step 400 (this setting)"] < ok["held-out accuracy at step 400 (this setting)"]
    assert ok["trained positions"] == "3 of 11" and bad["trained positions"] == "11 of 11"
    assert bad["answer's share of the loss tokens"] == round(3 / 11, 2)


def test_break_scheduler():
    """21: static batches need more engine forwards for the same responses, at a lower slot
    occupancy; the responses themselves are identical (counter-based sampling)."""
    ok, bad = kpis("scheduler"), broken("scheduler")
    assert bad["decode forwards (engine)"] > 1.2 * ok["decode forwards (engine)"]
    assert bad["slot occupancy"] < 0.8 and ok["slot occupancy"] > 0.9
    assert ok["responses cut by the 64-token cap"] <= 2  # lengths end by themselves
    from posttrain.lessons.widgets_systems import _sched_run

    assert _sched_run(8, True, 1.0)["responses"] == _sched_run(8, False, 1.0)["responses"]


# ---- systems ---------------------------------------------------------------------------------------


def test_break_kv():
    ok, bad = kpis("kv"), broken("kv")
    assert ok["bottleneck"] == "weight bandwidth dominates KV" and float(ok["H100s the KV alone needs"]) < 1
    assert bad["bottleneck"].startswith("HBM capacity") and float(bad["H100s the KV alone needs"]) > 8


def test_break_memory():
    ok, bad = kpis("memory"), broken("memory")
    assert ok["fits on H100s?"] == "yes" and bad["fits on H100s?"] == "no"
    assert float(bad["activations per GPU"].split()[0]) > 74.5 > float(ok["per-GPU training"].split()[0])


def test_break_planner():
    ok, bad = kpis("planner"), broken("planner")
    assert ok["fits on H100?"] == "yes" and bad["fits on H100?"] == "no"
    assert float(bad["peak per GPU"].split()[0]) > 5 * 74.5 and "LoRA" in bad["cheapest change that fits"]


def test_break_throughput():
    ok, bad = kpis("throughput"), broken("throughput")
    assert pct(bad["rollout share of the step"]) >= 95 > pct(ok["rollout share of the step"])


def test_break_stragglers():
    ok, bad = kpis("stragglers"), broken("stragglers")
    tax = lambda k: pct(k["straggler tax max/mean − 1"]) / 100 + 1
    assert tax(bad) > 9 and tax(ok) < 5


def test_break_failures():
    ok, bad = kpis("failures", mode="healthy", severity=1.0), broken("failures")
    assert ok["alarms fired"] == "none" and bad["alarms fired"] == "clip fraction high"
    assert bad["final clip/frac"] > 0.4
    gain = lambda k: k["final train reward"] - 0.309  # both start at 0.309
    assert gain(bad) < 0.75 * gain(ok)  # a stale sampler learns less


def test_break_sizing():
    ok, bad = kpis("sizing"), broken("sizing")
    assert ok["fits?"] == "yes" and bad["fits?"] == "no"
    state, hbm = bad["full training state 18 B × P"].split(" vs ")
    assert state.endswith("TiB") and float(state.split()[0]) * 1024 > float(hbm.split()[0])


def test_break_kernels():
    ok, bad = kpis("kernels"), broken("kernels")
    assert bad["logits held at once"] == bad["full logits"] == "8.0 GiB" and bad["chunking saves"] == "1×"
    assert ok["logits held at once"] == "256 MiB"


def test_break_off_policy():
    ok, bad = kpis("off_policy"), broken("off_policy")
    assert abs(ok["bias"]) < 0.02 and bad["bias"] < -0.25


# ---- gpt_mini track, continued ------------------------------------------------------------------------


def test_break_shapes():
    bad = broken("shapes")
    assert bad["head dim k = d/h"] == 512 and bad["unscaled q·k std √k"] == pytest.approx(512**0.5, abs=0.01)


def test_break_dpo_pair():
    ok, bad = kpis("dpo_pair"), broken("dpo_pair")
    assert bad["margin after 220 steps"] < ok["margin after 220 steps"] / 10


def test_break_lineage():
    ok, bad = kpis("lineage"), broken("lineage")
    assert ok["algorithms with no signal here"] == "none"
    assert bad["algorithms with no signal here"] == "ppo, grpo, rloo, dapo, dr_grpo"  # PPO: a one-group batch whitened
    assert floats(bad["reinforce"]) == [1.0] * 4


# ---- new widgets and the ones rebuilt on posttrain's functions --------------------------------------------


def test_break_forces_map():
    ok, bad = kpis("forces_map"), broken("forces_map")
    assert ok["forces that hold"] == 3 and bad["forces that hold"] == 0
    assert all(bad[f].startswith("fails") for f in ("SIGNAL", "ESTIMATOR", "COST"))


def test_break_topology():
    ok, bad = kpis("topology"), broken("topology")
    idle = lambda k: max(pct(k["rollout pool idle (one step off)"]), pct(k["trainer pool idle (one step off)"]))
    assert idle(ok) < 30 and pct(bad["rollout pool idle (one step off)"]) > 60
    assert bad["async / colocated"] < ok["async / colocated"] < 1  # on the same GPUs, colocated wins here
    assert kpis("topology", par=0.0)["async / colocated"] > 1  # unless the rollout does not scale


def test_break_classify():
    ok, bad = kpis("classify"), broken("classify")
    assert ok["consistent?"] == "yes" and ok["posttrain algorithms"] == "grpo, dapo, dr_grpo"
    assert bad["consistent?"] == "no" and bad["note 1"].startswith("inconsistent")


def test_break_gaps():
    ok, bad = kpis("gaps", gap="offpolicy"), broken("gaps")
    assert ok["this setting"] < 0.03 and bad["this setting"] > 0.25  # |bias| with and without TIS
    for gap in ("gae", "kl", "whiten", "lora", "prm", "curriculum", "entropy"):
        k = kpis("gaps", gap=gap, fix="on")
        better = {
            "gae": "lower",
            "kl": "lower",
            "whiten": "higher",
            "lora": "lower",
            "prm": "higher",
            "curriculum": "lower",
            "entropy": "higher",
        }[gap]
        assert (k["with the fix"] < k["without the fix"]) == (better == "lower"), gap


def test_break_forces():
    ok, bad = kpis("forces"), broken("forces")
    assert ok["π(solve) after the run"] > 0.5 and bad["π(solve) after the run"] < 0.1
    assert bad["proxy reward after the run"] - bad["held-out correctness after the run"] > 0.4
    assert bad["held-out correctness after the run"] < ok["held-out correctness after the run"]


def test_break_snr():
    ok, bad = kpis("snr"), broken("snr")
    assert bad["mean |ĝ − target|"] > 1.8 * ok["mean |ĝ − target|"]
    assert pct(bad["estimates that are exactly 0"]) > 40 and pct(ok["estimates that are exactly 0"]) < 10


def test_break_sync():
    ok, bad = kpis("sync"), broken("sync")
    assert ok["expected reward at step 50"] > 0.95 and bad["expected reward at step 50"] < 0.2
    fixed = kpis("sync", sync_every=20, correction="tis")  # the trainer's off-policy correction
    assert fixed["expected reward at step 50"] > 0.9 and fixed["clip/frac (mean over the run)"] == 0.0
    assert bad["clip/frac (mean over the run)"] > 0.15 > ok["clip/frac (mean over the run)"]


def test_break_budget():
    ok, bad = kpis("budget"), broken("budget")
    assert float(ok["speed-up"][:-1]) > 2 and float(bad["speed-up"][:-1]) < 1.15
    assert bad["largest remaining slice"].startswith("rollout") and pct(bad["largest remaining slice"].split()[1]) > 60
    dis = kpis("budget", **{**registry.get("budget").breaks["knobs"], "placement": "one_step_off"})
    assert dis["speed-up"] == "1.00×"  # the trainer hides inside rollout


def test_break_async_pipe():
    ok, bad = kpis("async_pipe"), broken("async_pipe")
    minutes = lambda k, key: float(k[key].split()[0])
    key, sync = "wall clock to accuracy 0.7", "wall clock to accuracy 0.7, on-policy"
    assert minutes(ok, key) < minutes(ok, sync)  # a little staleness pays
    assert minutes(bad, key) > minutes(bad, sync)  # a lot of it costs more than it buys
    assert bad["clip fraction (mean over the run)"] > 3 * ok["clip fraction (mean over the run)"]
    tis = kpis("async_pipe", delta=32, correction="tis")
    assert minutes(tis, key) < minutes(bad, key)  # the correction recovers part of it


# ---- every widget has its break test ----------------------------------------------------------------

# ---- recorded runs behind the widgets reproduce ------------------------------------------------------


def test_stale_runs_are_reproducible_and_staleness_reaches_the_sampler():
    """The first two recorded points of the Δ = 8 run re-run from scratch (3 seeds, 10 steps); with
    Δ = 0 the run is the plain all-on DAPO run, sample for sample."""
    from posttrain.lessons import dapo_toy, runs

    rec = runs.recorded()
    again = dapo_toy.averaged((True, True, True, True), steps=2 * dapo_toy.EVERY, staleness=8, correction="none")
    assert again["acc"] == pytest.approx(rec[dapo_toy.stale_key(8, "none")]["acc"][:2], abs=1e-3)
    assert rec[dapo_toy.stale_key(0, "none")]["acc"] == rec[dapo_toy.key(True, True, True, True)]["acc"]
    fresh = dapo_toy.run(True, True, True, True, steps=dapo_toy.EVERY, staleness=0, correction="tis")
    assert fresh["acc"] == dapo_toy.run(True, True, True, True, steps=dapo_toy.EVERY)["acc"]  # on-policy: w ≡ 1


def test_recorded_engine_model_round_trips_and_solves_sums():
    import torch

    from posttrain.framework.rollout import Engine, SamplingParams
    from posttrain.lessons import runs
    from posttrain.lessons.widgets_systems import _sched_setup

    model, tok, task, items, prompts = _sched_setup()
    again = runs.unpack_model(runs.pack_model(model))
    for a, b in zip(model.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)  # float16 weights survive a round trip
    samples = Engine(model, tok).generate(prompts, 1, SamplingParams(temperature=0.0, max_new_tokens=64))
    right = sum(task.reward(it, s.text).reward for it, s in zip(items, samples))
    assert right >= 4 and all(s.finish_reason == "stop" for s in samples)  # it writes traces that end


def test_every_function_a_widget_names_resolves_to_source_lines():
    from posttrain.lessons import pages

    for w in registry.load_all().values():
        for spec in w.uses:
            rel, a, b = pages.code_ref(spec)
            assert rel.startswith("posttrain/") and 0 < a <= b, (w.name, spec)


def test_every_widget_has_a_break_test():
    here = {n[len("test_break_") :] for n in dir(sys.modules[__name__]) if n.startswith("test_break_")}
    missing = sorted(set(registry.load_all()) - here)
    assert not missing, f"widgets without a break test: {missing}"
