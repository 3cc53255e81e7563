"""The quickstart (configs/grpo_gsm8k.yaml) and its reward (posttrain/tasks/gsm8k.py), held to verl.

The reference below is verl's code, copied verbatim: `extract_solution` and `compute_score` from
verl/utils/reward_score/gsm8k.py (volcengine/verl at b178a3cd, 2026-01-29; the same file ships in
the verl 0.9.1 wheel), and the ground-truth extraction of examples/data_preprocess/gsm8k.py. verl is
not installed here (its dependencies are a GPU stack); the copy is the reference.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hub_util import hub_home, offline  # noqa: F401  (fixtures)

from posttrain.tasks.gsm8k import compute_score, extract_solution

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "grpo_gsm8k.yaml"

# ---- verl, verbatim (reward_score/gsm8k.py) ----------------------------------------------------
_SOLUTION_CLIP_CHARS = 300


def verl_extract_solution(solution_str, method="strict"):
    assert method in ["strict", "flexible"]

    # Optimization: Regular expression matching on very long strings can be slow.
    # For math problems, the final answer is usually at the end.
    # We only match on the last 300 characters, which is a safe approximation for 300 tokens.
    if len(solution_str) > _SOLUTION_CLIP_CHARS:
        solution_str = solution_str[-_SOLUTION_CLIP_CHARS:]

    if method == "strict":
        # this also tests the formatting of the model
        solutions = re.findall("#### (\\-?[0-9\\.\\,]+)", solution_str)
        if len(solutions) == 0:
            final_answer = None
        else:
            # take the last solution
            final_answer = solutions[-1].replace(",", "").replace("$", "")
    elif method == "flexible":
        answer = re.findall("(\\-?[0-9\\.\\,]+)", solution_str)
        final_answer = None
        if len(answer) == 0:
            # no reward is there is no answer
            pass
        else:
            invalid_str = ["", "."]
            # find the last number that is not '.'
            for final_answer in reversed(answer):
                if final_answer not in invalid_str:
                    break
    return final_answer


def verl_compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
    answer = verl_extract_solution(solution_str=solution_str, method=method)
    if answer is None:
        return 0
    else:
        if answer == ground_truth:
            return score
        else:
            return format_score


# ---- verl, verbatim (examples/data_preprocess/gsm8k.py): the ground truth a row stores -----------
def verl_preprocess_solution(solution_str):
    solution = re.search("#### (\\-?[0-9\\.\\,]+)", solution_str)
    assert solution is not None
    final_solution = solution.group(0)
    final_solution = final_solution.split("#### ")[1].replace(",", "")
    return final_solution


GOLD = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"
GOLD_BIG = "3 * 1000 + 234 = <<3*1000+234=3234>>3234\n#### 3,234"
COMPLETIONS = [  # (completion, gold): hand-written, each a case verl's rule decides
    ("She sold 48 + 24 = 72 clips.\n#### 72", GOLD),  # right, after ####
    ("She sold 48 + 24 = 70 clips.\n#### 70", GOLD),  # wrong
    ("She sold 72 clips in all.", GOLD),  # missing: the number without ####
    ("The answer is 72.\n####72", GOLD),  # no space after ####: not verl's form
    ("#### 71 ... no, recount: #### 72", GOLD),  # the last #### counts
    ("#### $72", GOLD),  # "$" before the number: the regex needs a digit
    ("Total: 3,234\n#### 3,234", GOLD_BIG),  # commas, in the answer and the gold
    ("Total: 3234\n#### 3234", GOLD_BIG),  # no commas in the answer, commas in the gold
    ("#### 72.0", GOLD),  # string equality: 72.0 is not 72
    ("#### -72", GOLD),
    ("#### 72\n" + "and then some more words " * 20, GOLD),  # the #### falls before the last 300 characters
    ("x" * 400 + "\n#### 72", GOLD),  # a long response, the answer at its end
    ("", GOLD),
]


@pytest.mark.parametrize("completion,gold", COMPLETIONS)
def test_the_reward_is_verls_gsm8k_score(completion, gold):
    assert compute_score("openai/gsm8k", completion, gold) == verl_compute_score(
        completion, verl_preprocess_solution(gold)
    )
    assert compute_score("openai/gsm8k", completion, verl_preprocess_solution(gold)) == verl_compute_score(
        completion, verl_preprocess_solution(gold)
    )  # a verl-preprocessed row's bare ground truth too
    for method in ("strict", "flexible"):
        assert extract_solution(completion, method) == verl_extract_solution(completion, method)


def test_the_cases_cover_every_outcome():
    scores = [verl_compute_score(c, verl_preprocess_solution(g)) for c, g in COMPLETIONS]
    assert scores == [1.0, 0.0, 0, 0, 1.0, 0, 1.0, 1.0, 0.0, 0.0, 0, 1.0, 0]
    assert extract_solution("1 . 2 .", "flexible") == verl_extract_solution("1 . 2 .", "flexible") == "2"
    assert extract_solution(". .", "flexible") == verl_extract_solution(". .", "flexible") == "."


def test_the_quickstart_task_scores_hand_written_completions_as_verl(offline):
    """configs/grpo_gsm8k.yaml as it is: its rows come from the hub by id, its prompts are verl's, and
    its reward is verl's score of each completion against verl's ground truth of the row."""
    pytest.importorskip("datasets")
    from posttrain import tasks
    from posttrain.config import RLConfig, load_config

    cfg = load_config(RLConfig, str(CONFIG), [])
    assert cfg.init == "Qwen/Qwen2.5-0.5B-Instruct" and cfg.lora.r == 0
    task = tasks.make(cfg.task)
    items = task.items(3, "test")
    assert [it.prompt for it in items] == [
        r["question"] + ' Let\'s think step by step and output the final answer after "####".'
        for r in json.loads(json.dumps([it.columns for it in items]))
    ]
    texts = [c for c, _ in COMPLETIONS]
    for item in items:
        gold = verl_preprocess_solution(item.answer)
        completions = texts + [f"So the total is {gold}.\n#### {int(gold):,}"]
        got = [r.reward for r in task.reward_batch([item] * len(completions), completions, completions=completions)]
        assert got == [float(verl_compute_score(c, gold)) for c in completions]
        assert got[-1] == 1.0 and [
            r.correct for r in task.reward_batch([item], ["#### 0"], completions=["#### 0"])
        ] == [0.0]


@pytest.mark.slow
def test_the_quickstart_runs_end_to_end_on_the_cpu_with_size_overrides(hub_home, tmp_path):
    """`posttrain rl configs/grpo_gsm8k.yaml` with only sizes overridden, in a fresh process reading
    the test hub from HF_HOME with HF_HUB_OFFLINE=1: a reduced Qwen2.5 under Qwen/Qwen2.5-0.5B-Instruct
    and GSM8K-shaped rows under openai/gsm8k."""
    pytest.importorskip("datasets")
    env = {**os.environ, "HF_HOME": str(hub_home), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    sizes = [
        "steps=2",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=2",
        "rollout.max_new_tokens=16",
        "eval.problems=2",
        "eval_every=0",
        "save_every=0",
        "grad_checkpointing=false",
        "verifier.workers=0",
        "device=cpu",
        "threads=1",
        f"out={tmp_path}/rl",
    ]
    p = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "rl", str(CONFIG), *sizes], capture_output=True, text=True, env=env
    )
    assert p.returncode == 0, p.stderr[-3000:]
    run = tmp_path / "rl"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert len(steps) == 2 and all(r["mismatch/logprob_abs"] < 1e-5 for r in steps)
    assert "eval/greedy_acc" in rows[-1] and json.loads((run / "sources.json").read_text())["init"]["revision"]
    first = (run / "first_prompt.txt").read_text()
    assert first.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.") and first.endswith(
        'output the final answer after "####".<|im_end|>\n<|im_start|>assistant\n'
    )
