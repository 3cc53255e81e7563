"""The Python API on the CLI's config path, preference rows with every turn kept, and user Task classes."""

import json

import pytest
import torch

import posttrain
from posttrain import UsageError
from posttrain.models.tokenizer import CharTokenizer
from posttrain.preference.data import encode_pairs, row_pair

ROWS = [
    {"prompt": f"{a}+{b}", "answer": a + b, "completion": f"{{{a}+{b}={a + b}}}{a + b}"}
    for a in range(2, 12)
    for b in range(3, 9)
]


def correct(prompts, completions, answer, **kw):
    return [1.0 if c.split("}")[-1] == str(a) else 0.0 for c, a in zip(completions, answer)]


def brevity(completions, **kw):
    return [-0.01 * len(c) for c in completions]


COMMON = dict(
    steps=2,
    eval_every=2,
    threads=1,
    tensorboard=False,
    rollout={"prompts_per_step": 2, "samples_per_prompt": 4},
    eval={"problems": 4, "samples": 2},
)


def test_rl_takes_rows_and_python_reward_functions(sft_ckpt, tmp_path):
    run = posttrain.rl(
        init=str(sft_ckpt),
        dataset=ROWS,
        reward_funcs=[correct, brevity],
        reward_weights=[1.0, 0.5],
        out=str(tmp_path / "rl"),
        **COMMON,
        **{"algo.kl_coef": 0.0},
    )
    assert run.path == tmp_path / "rl" and run.stage == "rl"
    steps = [m for m in run.metrics if "reward/mean" in m]
    assert len(steps) == 2 and {"reward/correct", "reward/brevity"} <= set(steps[0])
    assert "eval/pass@1" in run.metrics[0] and run.summary["checkpoint"].endswith("step_000002")
    assert isinstance(run.policy, torch.nn.Module) and run.policy.config.vocab_size == run.tokenizer.vocab_size
    cfg = json.loads(json.dumps(__import__("yaml").safe_load((run.path / "config.yaml").read_text())))
    assert cfg["task"]["reward"] == "test_api:correct,test_api:brevity" and cfg["task"]["reward_weights"] == [1.0, 0.5]
    assert cfg["task"]["train"] == str(tmp_path / "rl" / "data" / "train.jsonl")  # rows in memory, written out
    assert cfg["algo"]["name"] == "grpo" and cfg["algo"]["kl_coef"] == 0.0 and cfg["rollout"]["max_new_tokens"] > 0
    res = run.evaluate(problems=4, samples=2, k=(1, 2))  # on the run's own task, its functions included
    assert {"eval/greedy_acc", "eval/pass@1", "eval/pass@2", "eval/reward_mean"} <= set(res)
    assert (run.path / "first_prompt.txt").read_text().startswith("<")


def test_the_api_validates_like_the_cli(tmp_path):
    with pytest.raises(
        UsageError, match="unknown config key 'beta' for RLConfig: that is TRL's name; posttrain's is 'algo.kl_coef'"
    ):
        posttrain.rl(beta=0.1, out=str(tmp_path / "x"))
    with pytest.raises(UsageError, match="reward_funcs= and correct_func= need a dataset"):
        posttrain.rl(reward_funcs=[correct], out=str(tmp_path / "y"))


def test_sft_from_rows_then_its_policy(sft_ckpt, tmp_path):
    run = posttrain.sft(
        init=str(sft_ckpt),
        dataset=ROWS,
        steps=2,
        batch_size=8,
        eval_problems=4,
        threads=1,
        out=str(tmp_path / "sft"),
        tensorboard=False,
    )
    assert run.metrics[-1]["step"] == 2 and "eval/greedy_acc" in run.metrics[-1]
    assert (run.path / "first_prompt.txt").exists()


CONVO = {  # TRL's conversational preference row: a system message and earlier turns in the prompt
    "prompt": [
        {"role": "system", "content": "add."},
        {"role": "user", "content": "3+4"},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "and +5"},
    ],
    "chosen": [{"role": "assistant", "content": "{7+5=12}12"}],
    "rejected": [{"role": "assistant", "content": "{7+5=13}13"}],
}


def test_conversational_preference_rows_keep_every_turn():
    from posttrain.chat import DEFAULT_CHARS, SYSTEM

    tok = CharTokenizer(DEFAULT_CHARS + SYSTEM)
    ((p, c, r),) = encode_pairs(tok, [row_pair(CONVO)])
    assert tok.decode(p) == "§add.<3+4>7#<and +5>" and tok.decode(c) == "{7+5=12}12#" and tok.decode(r) == "{7+5=13}13#"
    implicit = {"chosen": CONVO["prompt"] + CONVO["chosen"], "rejected": CONVO["prompt"] + CONVO["rejected"]}
    assert encode_pairs(tok, [row_pair(implicit)]) == [(p, c, r)]  # TRL's implicit prompt: the shared turns
    with pytest.raises(ValueError, match="unknown role 'bot'"):
        row_pair({**CONVO, "chosen": [{"role": "bot", "content": "x"}]})


def test_dpo_on_multi_turn_rows_through_the_api(sft_ckpt, tmp_path):
    rows = [
        {
            "prompt": [
                {"role": "user", "content": f"{a}+1"},
                {"role": "assistant", "content": f"{a + 1}"},
                {"role": "user", "content": f"{a + 1}+2"},
            ],
            "chosen": [{"role": "assistant", "content": f"{a + 3}"}],
            "rejected": [{"role": "assistant", "content": f"{a + 4}"}],
        }
        for a in range(20)
    ]
    run = posttrain.dpo(
        init=str(sft_ckpt),
        pairs=rows,
        steps=2,
        batch_size=4,
        eval_problems=0,
        threads=1,
        out=str(tmp_path / "dpo"),
        tensorboard=False,
    )
    saved = [json.loads(x) for x in (run.path / "pairs.jsonl").read_text().splitlines()]
    assert saved[0]["prompt"] == rows[0]["prompt"] and saved[0]["chosen"] == rows[0]["chosen"]  # every turn kept
    assert "pref/accuracy" in run.metrics[-1]


MY_TASK = '''
import random
from dataclasses import dataclass
from posttrain.tasks.base import RewardResult, TaskConfig

class Doubling:
    """A user's own task: double a number."""
    @dataclass
    class Config(TaskConfig):
        name: str = "doubling"
        max_value: int = 9            # largest number to double

    def __init__(self, config):
        self.config = config

    def items(self, n, split, seed):
        rng = random.Random(f"{split}/{seed}")
        return [rng.randint(0, self.config.max_value) for _ in range(n)]

    def prompt(self, item):
        return [{"role": "user", "content": f"{item}*2"}]

    def reward(self, item, response):
        ok = response.rstrip("#").endswith(str(2 * item))
        return RewardResult(float(ok), {"correct": float(ok)})
'''


def test_a_users_task_class_with_its_own_keys(sft_ckpt, tmp_path):
    (tmp_path / "my_tasks.py").write_text(MY_TASK)
    spec = f"{tmp_path}/my_tasks.py:Doubling"
    run = posttrain.rl(init=str(sft_ckpt), task={"name": spec, "max_value": 5}, out=str(tmp_path / "rl"), **COMMON)
    assert (
        run.metrics[-1]["step"] == 2
        and (run.path / "first_prompt.txt").read_text() == "<" + (run.path / "first_prompt.txt").read_text()[1:]
    )
    from posttrain.config import RLConfig, load_config

    with pytest.raises(
        UsageError, match="unknown config key 'task.max_valu' for Config; did you mean 'task.max_value'"
    ):
        load_config(RLConfig, None, [f"task.name={spec}", "task.max_valu=3"])
    with pytest.raises(UsageError, match="task.name='nosuch' is unknown; use one of arithmetic, countdown"):
        load_config(RLConfig, None, ["task.name=nosuch"])
