"""Reward functions see the completion TRL would hand them (issue 29): no end-of-turn marker, no
special token, on gpt_mini's template (`#`) and on a Hugging Face tokenizer whose end of turn is a
special token (`<|im_end|>`); `completion_ids` with the stop token and no padding, as TRL's; verl's
`solution_str` as verl's naive reward manager decodes it; the finish reason for whoever needs it."""

import json
import random

import pytest
from chatml_util import chatml_tokenizer

from posttrain.chat import DEFAULT_CHARS, SYSTEM
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.framework.sample import Sample
from posttrain.models.tokenizer import CharTokenizer
from posttrain.tasks.base import correctness, score_samples
from posttrain.tasks.dataset import DatasetConfig, DatasetTask

ROWS = [
    {
        "prompt": [
            {"role": "system", "content": "sort the digits."},
            {"role": "user", "content": "8 1 4 1"},
        ],
        "answer": "1 1 4 8",
        "data_source": "digits",
        "extra_info": {"index": 0},
    },
    {
        "prompt": [{"role": "system", "content": "sort the digits."}, {"role": "user", "content": "3 0 2"}],
        "answer": "0 2 3",
        "data_source": "digits",
        "extra_info": {"index": 1},
    },
]
REWARDS = '''
SEEN = []
def exact(prompts, completions, answer, completion_ids, finish_reason, **kwargs):
    """The issue's exact match, in TRL's signature (conversational completions)."""
    SEEN.append((completions, completion_ids, finish_reason))
    return [float(c[0]["content"].strip().split() == a.split()) for c, a in zip(completions, answer)]
def finished(completions, finish_reason, **kwargs):
    return [float(f == "stop") for f in finish_reason]
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    SEEN.append((data_source, solution_str, ground_truth, extra_info))
    return float(solution_str.split() == ground_truth.split())
'''


@pytest.fixture
def files(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "rewards.py").write_text(REWARDS)
    return path, tmp_path / "rewards.py"


def _task(files, reward="exact", **kw) -> DatasetTask:
    rows, fns = files
    return DatasetTask(
        DatasetConfig(train=str(rows), test=str(rows), reward=f"{fns}:{reward}", correct=f"{fns}:{reward}", **kw)
    )


def _sample(tok, item, response_ids: list[int], finish_reason="stop") -> Sample:
    """A sample as Engine._samples builds it from sampled ids."""
    return Sample(
        prompt_ids=[0],
        response_ids=response_ids,
        response_logprobs=[0.0] * len(response_ids),
        response_mask=[1] * len(response_ids),
        finish_reason=finish_reason,
        policy_version=0,
        group=0,
        index=0,
        item=item,
        text=tok.decode(response_ids),
        completion=tok.completion_text(response_ids),
    )


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    """A byte-level BPE tokenizer trained here (no download) with a ChatML template: `<|im_end|>`
    ends a turn and is a special token."""
    from posttrain.models.hf import HFTokenizer

    corpus = [" ".join(random.Random(i).choices("0123456789", k=6)) + " sort the digits." for i in range(300)]
    hf = chatml_tokenizer(corpus, 300)
    return HFTokenizer(hf)


def test_gpt_mini_completion_is_what_its_hugging_face_export_decodes_with_special_tokens_skipped(tmp_path):
    """CharTokenizer.completion_text against transformers on the exported tokenizer: TRL's
    batch_decode(..., skip_special_tokens=True) and verl's decode(..., skip_special_tokens=True)."""
    from transformers import PreTrainedTokenizerFast

    tok = CharTokenizer(DEFAULT_CHARS + SYSTEM)
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok.to_hf_json()))
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    rng = random.Random(0)
    ids = [[rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 30))] for _ in range(200)]
    ids += [tok.encode("{3+4=7}7#"), tok.encode("1 1 4 8#"), tok.encode("a<b>c§d_e#")]
    assert [tok.completion_text(i) for i in ids] == hf.batch_decode(ids, skip_special_tokens=True)
    assert [tok.completion_text(i) for i in ids] == [hf.decode(i, skip_special_tokens=True) for i in ids]
    assert tok.completion_text(tok.encode("{3+4=7}7#")) == "{3+4=7}7"  # the think delimiters are text
    assert tok.completion_text(tok.encode("a<b>c§d_e#")) == "abcde"


def test_the_engine_hands_every_sample_its_completion(tok, nano):
    samples = Engine(nano, tok).generate(
        [tok.encode("<1+2>")] * 4, 4, SamplingParams(temperature=1.0, max_new_tokens=12), seed=0
    )
    assert {s.finish_reason for s in samples} == {"stop", "length"}
    for s in samples:
        assert s.completion == tok.completion_text(s.response_ids)
        assert "".join(c for c in s.text if c not in "#<>§_") == s.completion  # the markers dropped
        assert s.text.endswith("#") == (s.finish_reason == "stop") == (s.response_ids[-1] == tok.eot_id)


def test_exact_match_scores_a_right_answer_on_gpt_mini(files):
    tok = CharTokenizer(DEFAULT_CHARS + SYSTEM)
    task = _task(files)
    task.check(tok, 512, 16)
    a, b = task.train
    samples = [
        _sample(tok, a, tok.encode("1 1 4 8#")),  # right, finished
        _sample(tok, b, tok.encode(" 0 2 3 #")),  # right, spaces around it
        _sample(tok, a, tok.encode("1 1 4 9#")),  # wrong
        _sample(tok, b, tok.encode("0 2 3"), "length"),  # right text, cut by the cap
    ]
    metrics = score_samples(task, samples)
    assert [s.reward for s in samples] == [1.0, 1.0, 0.0, 1.0] and metrics["reward/errors"] == 0.0
    seen = _batch_seen(task, 4)  # the batch as the reward function got it: TRL's conversational completions
    assert seen[0] == [[{"role": "assistant", "content": t}] for t in ("1 1 4 8", " 0 2 3 ", "1 1 4 9", "0 2 3")]
    assert seen[1] == [s.response_ids for s in samples] and seen[1][0][-1] == tok.eot_id  # TRL's: eos kept
    assert seen[2] == ["stop", "stop", "stop", "length"]
    assert [correctness(task.reward(*_args(task, s))) for s in samples] == [1.0, 1.0, 0.0, 1.0]


def test_exact_match_scores_a_right_answer_with_a_special_end_of_turn_token(files, chatml):
    task = _task(files)
    task.check(chatml, 512, 16)
    a, b = task.train
    ids = chatml.encode("1 1 4 8") + [chatml.eot_id]
    assert chatml.decode(ids) == "1 1 4 8<|im_end|>"  # what the verifier used to get
    samples = [_sample(chatml, a, ids), _sample(chatml, b, chatml.encode("0 2 3") + [chatml.eot_id])]
    samples.append(_sample(chatml, a, chatml.encode("1 4 8") + [chatml.eot_id]))
    score_samples(task, samples)
    assert [s.reward for s in samples] == [1.0, 1.0, 0.0]
    trl_text = chatml.tok.batch_decode([s.response_ids for s in samples], skip_special_tokens=True)  # TRL's decode
    assert [c[0]["content"] for c in _batch_seen(task, 3)[0]] == trl_text == ["1 1 4 8", "0 2 3", "1 4 8"]


def test_a_verl_compute_score_gets_the_text_verl_would(files, chatml):
    """verl's NaiveRewardManager: decode(valid response ids, skip_special_tokens=True), extra_info
    with num_turns and rollout_reward_scores added."""
    task = _task(files, "compute_score")
    a = task.train[0]
    ids = chatml.encode("1 1 4 8") + [chatml.eot_id]
    samples = [_sample(chatml, a, ids)]
    score_samples(task, samples)
    assert samples[0].reward == 1.0
    source, solution, truth, extra = _module(task).SEEN[-1]
    assert solution == chatml.tok.decode(ids, skip_special_tokens=True) == "1 1 4 8"
    assert (source, truth) == ("digits", "1 1 4 8")
    assert extra == {"index": 0, "num_turns": None, "rollout_reward_scores": {}}


def test_the_pool_workers_get_the_same_completion_and_finish_reason(files):
    from posttrain.tasks.pool import VerifierPool

    tok = CharTokenizer(DEFAULT_CHARS + SYSTEM)
    task = _task(files, "finished")
    a, b = task.train
    samples = [_sample(tok, a, tok.encode("1 1 4 8#")), _sample(tok, b, tok.encode("0 2"), "length")]
    with VerifierPool(task, workers=1, timeout_s=30.0) as pool:
        score_samples(task, samples, pool)
    assert [s.reward for s in samples] == [1.0, 0.0]


def test_trl_rewards_run_unchanged_on_the_completion(files, chatml):
    """trl.rewards as TRL calls them, on an HF end-of-turn token: the think format and the soft
    overlong punishment (which counts completion_ids, the stop token included as in TRL)."""
    from trl.rewards import get_soft_overlong_punishment, think_format_reward

    rows, _ = files
    good = chatml.encode("<think>x</think>1 1 4 8") + [chatml.eot_id]
    overlong = get_soft_overlong_punishment(max_completion_len=len(good) + 1, soft_punish_cache=4)
    task = DatasetTask(DatasetConfig(train=str(rows), test=str(rows)), reward_funcs=[think_format_reward, overlong])
    samples = [_sample(chatml, task.train[0], good)]
    score_samples(task, samples)
    # (L − cache − len) / cache = (len + 1 − 4 − len) / 4: the stop token counts, as in TRL
    assert samples[0].reward_components == {"think_format_reward": 1.0, "soft_overlong_punishment_reward": -0.75}


def _module(task):
    import sys

    return sys.modules[task.fns[0].fn.__module__]


def _batch_seen(task, n: int):
    """The first call of the reward function on a batch of n (the dry call at startup has 2 rows)."""
    return next(s for s in _module(task).SEEN if len(s[0]) == n)


def _args(task, sample):
    from posttrain.tasks.base import verifier_args

    return verifier_args(task, sample)


def test_a_suspicious_held_out_accuracy_names_its_source_and_a_completion_once(files, capsys):
    """Correctness 0 on every held-out sample while the rewards vary (a correctness function still
    waiting for the end-of-turn marker): the first evaluation prints one line naming task.correct and
    showing a completion exactly as the function received it; every evaluation logs it for the report."""
    import torch

    from posttrain.eval import SUSPECT, evaluate
    from posttrain.models.gpt_mini import GPTMini, ModelConfig

    rows, fns = files
    fns.write_text(
        "SEEN = []\n"
        "def marker(completions, **kw):\n    return [c[0]['content'].endswith('#') for c in completions]\n"
        "def short(completions, **kw):\n    SEEN.extend(c[0]['content'] for c in completions)\n"
        "    return [-0.01 * len(c[0]['content']) for c in completions]\n"
    )
    task = DatasetTask(DatasetConfig(train=str(rows), test=str(rows), reward=f"{fns}:short", correct=f"{fns}:marker"))
    tok = CharTokenizer(DEFAULT_CHARS + SYSTEM)
    torch.manual_seed(0)
    model = GPTMini(ModelConfig(preset="nano").resolved(tok.vocab_size))
    res = evaluate(model, tok, task, task.test, n=4, ks=(1,), max_new_tokens=6)
    again = evaluate(model, tok, task, task.test, n=4, ks=(1,), max_new_tokens=6, seed=1)
    assert res["eval/greedy_acc"] == res["eval/pass@1"] == 0.0 and again[SUSPECT].startswith("held-out accuracy is 0")
    line = res[SUSPECT]
    assert line.startswith("held-out accuracy is 0 on all 10 samples while their rewards vary (") and "\n" not in line
    assert f"correctness comes from task.correct={fns}:marker; the best-rewarded completion, exactly as" in line
    shown = eval(line.rsplit("exactly as it received it: ", 1)[1])
    seen = _module(task).SEEN[:10]  # the first evaluation's 10 completions, as the function got them
    assert shown in seen and len(shown) == min(map(len, seen)) and not any("#" in c for c in seen)
    assert capsys.readouterr().out.count("held-out accuracy is 0") == 1  # said once, at the first evaluation


def test_an_accuracy_that_varies_or_rewards_that_do_not_raise_nothing():
    from posttrain.eval import suspicious_accuracy
    from posttrain.tasks.base import RewardResult

    tok = CharTokenizer()
    s = _sample(tok, None, tok.encode("7#"))
    same = [(s, RewardResult(0.5, correct=0.0)), (s, RewardResult(0.5, correct=0.0))]
    mixed = [(s, RewardResult(0.5, correct=1.0)), (s, RewardResult(0.2, correct=0.0))]
    assert suspicious_accuracy(DatasetTask.__new__(DatasetTask), same) is None
    assert suspicious_accuracy(DatasetTask.__new__(DatasetTask), mixed) is None
