"""Countdown, the reasoning-gym adapter, the tool-use task, the task registry and reward composition."""

import pytest

from posttrain import UsageError, tasks
from posttrain.config import RLConfig, SFTConfig, load_config, save_config
from posttrain.tasks.arithmetic import ArithmeticConfig, Problem, is_heldout
from posttrain.tasks.base import compose, in_heldout, length_shaping
from posttrain.tasks.countdown import CountdownConfig, CountdownTask, expression_of
from posttrain.tasks.tools import ToolArithmeticConfig, ToolArithmeticTask, final_answer, safe_eval

# ---- reward composition --------------------------------------------------------------------------


def test_compose_and_length_shaping_worked_values():
    r = compose({"correct": 1.0, "format": 1.0, "length": -0.2}, {"format": 0.1})
    assert r.reward == pytest.approx(0.9) and r.components == {"correct": 1.0, "format": 1.0, "length": -0.2}
    assert compose({"correct": 0.0, "format": 1.0}, {"format": 0.1}).reward == pytest.approx(0.1)
    # budget 100, ramp 20: 0 up to 80, −0.5 at 90, −1 at 100 and beyond; no ramp = no shaping
    assert [length_shaping(n, 100, 20) for n in (50, 80, 90, 100, 130)] == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert length_shaping(500, 100, 0) == 0.0


def test_in_heldout_is_the_arithmetic_split():
    p = Problem((3, 4, 5))
    assert in_heldout(p.question, 0.3) == is_heldout(p, 0.3)


# ---- countdown ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response,want",
    [
        ("(3+5)*2#", (1.0, 1.0)),
        ("2*(5+3)#", (1.0, 1.0)),
        ("{3+5=8;8*2=16}(3+5)*2#", (1.0, 1.0)),
        ("(3+5)*2=16#", (1.0, 1.0)),
        ("3*5+2#", (0.0, 1.0)),  # well formed, 17 ≠ 16
        ("(3+5)*2*1#", (0.0, 0.0)),
        ("8*2#", (0.0, 0.0)),  # numbers not used exactly once
        ("(3+5)*2+", (0.0, 0.0)),
        ("__import__('os')#", (0.0, 0.0)),
        ("", (0.0, 0.0)),
        ("(3+5)/(2-2)#", (0.0, 0.0)),
        ("16#", (0.0, 0.0)),
    ],
)
def test_countdown_verifier_table(response, want):
    from posttrain.tasks.countdown import CountdownProblem, score

    p = CountdownProblem((3, 5, 2), 16, "(3+5)*2", ("3+5=8", "8*2=16"))
    assert score(response, p.numbers, p.goal) == want
    assert CountdownTask().reward(p, response).reward == pytest.approx(want[0] + 0.1 * want[1])


def test_countdown_final_answer_for_majority_vote():
    task = CountdownTask()
    assert [task.final_answer(r) for r in ("(3+5)*2#", "{x}7/2#", "1/0#", "(3+#")] == [16, None, None, None]


def test_countdown_problems_are_solvable_and_split():
    task = CountdownTask(CountdownConfig(min_numbers=3, max_numbers=4, max_value=9))
    train, test = task.items(300, "train", 0), task.items(100, "test", 0)
    assert train == task.items(300, "train", 0) and train != task.items(300, "train", 1)
    assert not {p.question for p in train} & {p.question for p in test}
    for p in train[:100]:
        assert safe_eval(p.solution) == p.goal and 1 <= p.goal <= 99 and len(p.numbers) in (3, 4)
        assert task.reward(p, p.target(True) + "#").components["correct"] == 1.0
        assert expression_of(p.target(True) + "#") == p.solution
        last = p.steps[-1]
        assert last.endswith(f"={p.goal}")  # the trace ends on the target


# ---- tool-use arithmetic -----------------------------------------------------------------------


def test_tool_task_answer_is_what_the_policy_wrote_after_the_result():
    task = ToolArithmeticTask(ToolArithmeticConfig(min_digits=5, max_digits=7))
    items = task.items(400, "train", 0)
    assert all(len(str(t)) in (5, 6, 7) for p in items for t in p.terms)
    frac = sum(p.demo_calls_tool for p in items) / len(items)
    assert 0.2 < frac < 0.4  # demo_tool_frac = 0.3
    p = items[0]
    a = p.answer
    assert final_answer(f"⟦{p.question}⟧⟨{a}⟩{a}#") == a
    assert final_answer(f"⟦{p.question}⟧⟨{a}⟩#") is None  # copying is the policy's job
    assert task.reward(p, f"⟦{p.question}⟧⟨{a}⟩{a + 1}#").reward == 0.0
    assert task.reward(p, f"{a}#").components == {"correct": 1.0, "tool_called": 0.0}


def test_tool_demonstrations_mask_the_result_in_sft(tok):
    from posttrain.recipes.sft import examples

    task = ToolArithmeticTask()
    prompts, responses = examples(task, tok, 50, 0, True)
    for r in responses:
        text, mask = tok.decode(r), tok.policy_mask(r)
        if "⟨" in text:
            i, j = text.index("⟨"), text.index("⟩")
            assert mask == [1] * i + [0] * (j - i + 1) + [1] * (len(text) - j - 1)
        else:
            assert mask == [1] * len(r)


# ---- reasoning-gym adapter -------------------------------------------------------------------------


def test_reasoning_gym_adapter_scores_with_its_dataset():
    from posttrain.tasks.reasoning_gym import ReasoningGymConfig, ReasoningGymTask

    task = ReasoningGymTask(
        ReasoningGymConfig(
            dataset="chain_sum", options={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
        )
    )
    train, test = task.items(60, "train", 0), task.items(20, "test", 0)
    assert [i.question for i in train] == [i.question for i in task.items(60, "train", 0)]
    assert not {i.question for i in train} & {i.question for i in test}
    it = train[0]
    expr = it.question.rsplit(":", 1)[1].rstrip("= ").strip()
    assert str(safe_eval(expr)) == it.answer_text  # the generator's own problem
    assert task.reward(it, f"{it.answer_text}#").components == {"score": 1.0, "correct": 1.0}
    assert task.reward(it, "{thinking}" + f" {it.answer_text} #").reward == 1.0
    assert task.reward(it, f"{int(it.answer_text) + 1}#").reward == 0.0
    tok_chars = set(__import__("posttrain.models.tokenizer", fromlist=["x"]).DEFAULT_CHARS)
    assert all(set(i.question) <= tok_chars for i in train)


def test_reasoning_gym_bad_dataset_and_characters_name_the_fix():
    from posttrain.tasks.reasoning_gym import ReasoningGymConfig, ReasoningGymTask

    with pytest.raises(UsageError, match="task.dataset='no_such_set'"):
        ReasoningGymTask(ReasoningGymConfig(dataset="no_such_set"))
    with pytest.raises(UsageError, match="fit the char tokenizer"):  # "sun -> nus": '>' is a chat special
        ReasoningGymTask(ReasoningGymConfig(dataset="spell_backward")).items(5)
    # the fix the message names: map "->" away in the questions; answers and the scorer are untouched
    task = ReasoningGymTask(
        ReasoningGymConfig(
            dataset="spell_backward", question_subs={"->": "to"}, options={"min_word_len": 3, "max_word_len": 6}
        )
    )
    items = task.items(20)
    assert len(items) == 20 and all("(example: sun to nus)" in i.question for i in items)
    it = items[0]
    word = it.question.rsplit(":", 1)[1].strip()
    assert it.answer_text == word[::-1] and 3 <= len(word) <= 6
    assert task.reward(it, f"{word[::-1]}#").reward == 1.0 and task.reward(it, f"{word}#").reward < 1.0


# ---- registry and config ------------------------------------------------------------------------------


def test_task_name_selects_the_task_and_its_config(tmp_path):
    assert isinstance(load_config(RLConfig, "grpo_arith").task, ArithmeticConfig)  # existing presets unchanged
    cfg = load_config(RLConfig, None, ["task.name=countdown", "task.max_numbers=4"])
    assert isinstance(cfg.task, CountdownConfig) and cfg.task.max_numbers == 4
    assert isinstance(tasks.make(cfg.task), CountdownTask)
    save_config(cfg, tmp_path / "c.yaml")  # the resolved config round-trips
    assert load_config(RLConfig, str(tmp_path / "c.yaml")).task == cfg.task
    sft = load_config(SFTConfig, None, ["task.name=tool_arith", "task.demo_tool_frac=0.5"])
    assert isinstance(sft.task, ToolArithmeticConfig) and sft.task.demo_tool_frac == 0.5


def test_task_config_errors_name_the_fix():
    with pytest.raises(UsageError, match="task.name='sudoku' is unknown; use one of arithmetic, countdown"):
        load_config(RLConfig, None, ["task.name=sudoku"])
    with pytest.raises(UsageError, match="'task.max_terms' for CountdownConfig; did you mean 'task.max_numbers'"):
        load_config(RLConfig, None, ["task.name=countdown", "task.max_terms=3"])
    with pytest.raises(UsageError, match="did you mean 'task.max_digits'"):
        load_config(RLConfig, None, ["task.name=tool_arith", "task.max_digit=3"])
    from posttrain.recipes.pipeline import PipelineConfig  # a stage built for one task says so

    with pytest.raises(UsageError, match="task.name='countdown': this stage runs on task.name=arithmetic only"):
        load_config(PipelineConfig, None, ["task.name=countdown"])
