import pytest
import torch

from posttrain.models.gpt_mini import GPTMini, KVCache, ModelConfig, count_params


@pytest.mark.parametrize(
    "kw",
    [
        dict(preset="nano"),
        dict(preset="micro"),
        dict(preset="nano", n_kv_heads=2),
        dict(preset="nano", tie_embeddings=True),
    ],
)
def test_param_count_matches_formula(kw):
    c = ModelConfig(**kw).resolved(58)
    assert GPTMini(c).num_params() == count_params(c)


def test_param_count_by_hand():
    # d=128, L=4, ff=344, V=58, untied: per block 4·128² + 3·128·344 + 2·128 = 197,888
    c = ModelConfig(preset="nano").resolved(58)
    assert count_params(c) == 58 * 128 + 4 * 197_888 + 128 + 58 * 128 == 806_528


def test_presets_sizes():
    assert 0.75e6 < count_params(ModelConfig(preset="nano").resolved(58)) < 0.85e6
    assert 4.5e6 < count_params(ModelConfig(preset="micro").resolved(58)) < 5.2e6


def test_kv_cache_matches_full_forward(nano):
    nano.eval()
    x = torch.randint(0, 58, (3, 20))
    full = nano(x)
    cache = KVCache(nano.config, 3)
    cache.begin(12)
    outs = [nano(x[:, :12], cache)]
    for t in range(12, 20):
        cache.begin(1)
        outs.append(nano(x[:, t : t + 1], cache))
    assert torch.allclose(full, torch.cat(outs, 1), atol=1e-5)


def test_causal(nano):
    """Changing a later token never changes earlier logits."""
    nano.eval()
    x = torch.randint(0, 58, (1, 10))
    y = x.clone()
    y[0, 7] = (y[0, 7] + 1) % 58
    assert torch.equal(nano(x)[:, :7], nano(y)[:, :7])
    assert not torch.allclose(nano(x)[:, 7:], nano(y)[:, 7:])


def test_sequence_too_long_is_a_usage_error(nano):
    from posttrain import UsageError

    with pytest.raises(UsageError, match="max_seq_len"):
        nano(torch.zeros(1, nano.config.max_seq_len + 1, dtype=torch.long))
