import os
import sys
import threading

# torch.compile's inductor compiles kernels in a pool of worker processes (one per core, up to 32),
# shut down by an atexit hook that waits up to 300 s on a pool whose start was cold: on torch 2.11
# (pytorch/pytorch#162199, fixed by #184038 in 2.13) a process that compiled once can then sit at
# exit for minutes. On the H200 machine (16 cores) the quick lane's first run reached 100% and hung
# until its 170 s limit (issue 43); the tests compile tiny graphs, so they compile in-process, as
# torch's own distributed tests do. Set before torch imports inductor's config, which reads it.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

THREADS = int(os.environ.get("POSTTRAIN_TEST_THREADS", "2"))
torch.set_num_threads(THREADS)


def pytest_sessionfinish(session, exitstatus):
    """Nothing of the tests' may keep the process from exiting: inductor's compile workers, if a
    test started them anyway, are shut down here, and a thread left running that Python would wait
    for at exit (not a daemon) is named, so a hang says whose it is."""
    inductor = sys.modules.get("torch._inductor.async_compile")
    if inductor is not None:
        inductor.shutdown_compile_workers()
    alive = [
        t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    if alive:
        print(f"\nconftest: threads still running at the end of the session (Python waits for them at exit): {alive}")


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
