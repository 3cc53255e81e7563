import pytest

from posttrain import UsageError
from posttrain.config import PretrainConfig, RLConfig, SFTConfig, load_config, save_config


def test_overrides_and_nested_defaults():
    c = load_config(PretrainConfig, None, ["steps=7", "model.preset=micro", "optim.lr=1e-3"])
    assert c.steps == 7 and c.model.preset == "micro" and c.optim.lr == 1e-3
    assert c.optim.warmup_steps == PretrainConfig().optim.warmup_steps  # the stage's own default survives


def test_yaml_file_and_roundtrip(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("steps: 3\ncot: false\noptim:\n  lr: 0.01\n")
    c = load_config(SFTConfig, str(p), ["seed=5"])
    assert (c.steps, c.cot, c.optim.lr, c.seed) == (3, False, 0.01, 5)
    save_config(c, tmp_path / "out.yaml")
    assert load_config(SFTConfig, str(tmp_path / "out.yaml")) == c


@pytest.mark.parametrize(
    "override,message",
    [
        ("mask_promt=1", "unknown config key 'mask_promt' for SFTConfig; did you mean 'mask_prompt'?"),
        ("lr=0.1", "unknown config key 'lr' for SFTConfig; did you mean 'optim.lr'?"),
        ("steps=abc", "config key 'steps' expects int, got 'abc' (str)"),
        ("cot=maybe", "config key 'cot' expects bool, got 'maybe' (str)"),
        ("optim.betas=[0.9]", "config key 'optim.betas' expects 2 values, got 1"),
        ("model=3", "config key 'model' is a section; give it as model.<field>=value"),
        ("steps", "override 'steps' must look like key=value (e.g. steps=100)"),
    ],
)
def test_bad_overrides(override, message):
    with pytest.raises(UsageError) as e:
        load_config(SFTConfig, None, [override])
    assert str(e.value) == message


def test_missing_file():
    with pytest.raises(UsageError, match="config file 'nope.yaml' not found"):
        load_config(SFTConfig, "nope.yaml")


def test_on_and_off_reach_a_key_that_takes_them():
    """YAML 1.1 reads `on`/`off` as booleans: a `bool | str` key takes them as True/False (the first
    type that fits), its words as strings, and anything else is one line naming the key."""
    load = lambda *o: load_config(RLConfig, None, list(o))  # noqa: E731
    assert load("rollout.vllm.sleep=on").rollout.vllm.sleep is True
    assert load("rollout.vllm.sleep=off").rollout.vllm.sleep is False
    assert load("rollout.vllm.sleep=auto").rollout.vllm.sleep == "auto"
    assert load("optim.compile=on").optim.compile is True
    with pytest.raises(UsageError, match="rollout.vllm.sleep"):
        load("rollout.vllm.sleep=[1]")
