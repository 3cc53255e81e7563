import os

import pytest
import torch

torch.set_num_threads(int(os.environ.get("POSTTRAIN_TEST_THREADS", "2")))


@pytest.fixture
def tok():
    from posttrain.models.tokenizer import CharTokenizer
    return CharTokenizer()


@pytest.fixture
def nano(tok):
    from posttrain.models.gpt_mini import GPTMini, ModelConfig
    torch.manual_seed(0)
    return GPTMini(ModelConfig(preset="nano").resolved(tok.vocab_size))
