import os

import pytest
import torch

THREADS = int(os.environ.get("POSTTRAIN_TEST_THREADS", "2"))
torch.set_num_threads(THREADS)


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.gpu` tests run only where CUDA is: the same suite passes on both machines."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (@pytest.mark.gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _torch_threads():
    """Every test starts with the suite's thread count: a stage run with `threads=1` (or a
    lesson recording) sets torch's process-wide count, which would slow every later test."""
    torch.set_num_threads(THREADS)
    yield


@pytest.fixture
def tok():
    from posttrain.models.tokenizer import CharTokenizer

    return CharTokenizer()


@pytest.fixture
def nano(tok):
    from posttrain.models.gpt_mini import GPTMini, ModelConfig

    torch.manual_seed(0)
    return GPTMini(ModelConfig(preset="nano").resolved(tok.vocab_size))


TINY_TASK = ["task.max_terms=3"]


@pytest.fixture(scope="session")
def sft_ckpt(tmp_path_factory):
    """A tiny pretrain → SFT chain (a few steps): a real checkpoint for stage tests, trained on the
    CPU in fp32 on every machine (device=auto would train it in bf16 on a GPU, and the tests that
    pin CPU numbers start from it)."""
    from posttrain.config import PretrainConfig, SFTConfig, load_config
    from posttrain.recipes import pretrain, sft

    root = tmp_path_factory.mktemp("chain")
    pretrain.run(
        load_config(
            PretrainConfig,
            None,
            [f"out={root}/pt", "steps=3", "batch_size=4", "seq_len=32", "corpus_chars=4000", "device=cpu", *TINY_TASK],
        )
    )
    sft.run(
        load_config(
            SFTConfig,
            None,
            [
                f"out={root}/sft",
                f"init={root}/pt",
                "steps=3",
                "batch_size=8",
                "num_problems=200",
                "eval_problems=10",
                "device=cpu",
                *TINY_TASK,
            ],
        )
    )
    return root / "sft"
