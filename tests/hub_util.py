"""A Hugging Face Hub on disk, without a network: models and datasets where huggingface_hub and
`datasets` keep what they fetched, so `org/name` resolves with HF_HUB_OFFLINE=1 through the real
clients (test_hub.py, test_hub_data.py, test_gsm8k.py, test_instruct_tokenizers.py; the fixtures
`hub_home` and `offline` at the end).

Models: `hub/models--ORG--NAME/snapshots/<commit>/` + `refs/main`, the layout `snapshot_download`
writes. A model is a randomly initialised transformers directory (a Qwen2ForCausalLM of reduced
size, a small Llama) with a byte-level BPE tokenizer trained here by `tokenizers` on made-up text
and carrying the published chat format of its family:

  qwen    <|im_start|>ROLE\\nTEXT<|im_end|>\\n, the default system turn Qwen2.5 Instruct inserts
          ("You are Qwen, created by Alibaba Cloud. You are a helpful assistant."); eos <|im_end|>,
          pad <|endoftext|>; generation_config eos_token_id [<|im_end|>, <|endoftext|>]
          (Qwen/Qwen2.5-0.5B-Instruct's tokenizer_config.json and generation_config.json)
  llama3  <|begin_of_text|><|start_header_id|>ROLE<|end_header_id|>\\n\\nTEXT<|eot_id|>; eos
          <|eot_id|>; generation_config eos_token_id [<|end_of_text|>, <|eot_id|>]
          (meta-llama/Meta-Llama-3-8B-Instruct's template and generation_config.json)

Datasets: `datasets/ORG___NAME/SUBSET/0.0.0/<commit>/` (arrow files + dataset_info.json), the copy
`load_dataset("ORG/NAME", SUBSET)` leaves after reading the hub and reads back offline. It is
written by `datasets` itself from a local repository folder (parquet files and the README's
`configs:` block, as on the hub) and named as a hub read names it.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

QWEN_TEMPLATE = (  # Qwen2.5 Instruct's template, its branches without tools
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA3_TEMPLATE = (  # Meta-Llama-3-8B-Instruct's template
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
FAMILIES = {
    "qwen": dict(
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        template=QWEN_TEMPLATE,
        tokens=dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"),
        gen_eos=["<|im_end|>", "<|endoftext|>"],
        tokenizer_class="Qwen2Tokenizer",
    ),
    "llama3": dict(
        specials=["<|end_of_text|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        template=LLAMA3_TEMPLATE,
        tokens=dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"),
        gen_eos=["<|end_of_text|>", "<|eot_id|>"],
        tokenizer_class="PreTrainedTokenizerFast",
    ),
}
QWEN_SMALL = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128
)
QWEN_05B = dict(
    hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864
)
GSM8K_ROWS = [  # GSM8K's form: a question, a worked answer ending "#### N" (N with commas when large)
    {
        "question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
        "answer": f"{a} + {b} = {a + b}\n#### {a + b:,}",
    }
    for a, b in [
        (3, 4),
        (10, 5),
        (7, 8),
        (1200, 34),
        (2, 2),
        (9, 1),
        (40, 2),
        (5, 6),
        (11, 11),
        (999, 1),
        (6, 7),
        (8, 8),
    ]
]


def corpus(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["apples", "Tom", "has", "buys", "more", "How", "many", "answer", "think", "step", "by", "the", "####"]
    rows = [r["question"] + " " + r["answer"] for r in GSM8K_ROWS]
    return rows + [" ".join(rng.choice(words) + str(rng.randint(0, 99)) for _ in range(12)) for _ in range(300)]


def train_tokenizer(family: str):
    """A byte-level BPE (transformers' PreTrainedTokenizerFast) with `family`'s special tokens (ids
    0, 1, …), eos, pad and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    f = FAMILIES[family]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=f["specials"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(corpus(), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, **f["tokens"])
    tok.chat_template = f["template"]
    return tok


def write_model(out: Path, family: str = "qwen", dims: dict | None = None, seed: int = 0, max_len: int = 512) -> Path:
    """A random-weight transformers directory of `family` (qwen: Qwen2ForCausalLM, tied; llama3:
    LlamaForCausalLM) with its tokenizer and a generation_config.json listing its eos ids."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    tok = train_tokenizer(family)
    eos = [tok.convert_tokens_to_ids(t) for t in FAMILIES[family]["gen_eos"]]
    common = {  # `dims` may widen the vocabulary past the tokenizer's (a real model's 151,936)
        "vocab_size": len(tok),
        "max_position_embeddings": max_len,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": tok.pad_token_id,
        **(dims or QWEN_SMALL),
    }
    cfg = Qwen2Config(tie_word_embeddings=True, rope_theta=1e6, **common) if family == "qwen" else LlamaConfig(**common)
    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    if common["hidden_size"] < 512:  # the reduced sizes: transformers' own init
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    else:  # a real size: transformers' init of 0.5B parameters takes ~40 s on a loaded core, so one
        model = _tiled_init(AutoModelForCausalLM, cfg, seed)  # random block tiles every tensor instead
    model.generation_config.eos_token_id = eos
    model.save_pretrained(out)
    tok.save_pretrained(out)
    tc = json.loads((out / "tokenizer_config.json").read_text())
    tc["tokenizer_class"] = FAMILIES[family]["tokenizer_class"]  # as the published repositories say
    (out / "tokenizer_config.json").write_text(json.dumps(tc))
    return out


def _tiled_init(auto, cfg, seed: int):
    """A model whose every tensor is a 2^20-value seeded N(0, 0.02) block repeated: random enough to
    decode (no two positions alike), written in seconds at 0.5B parameters."""
    import torch

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4
        from transformers.modeling_utils import no_init_weights
    with no_init_weights():
        model = auto.from_config(cfg, dtype=torch.float32)
    block = torch.randn(1 << 20, generator=torch.Generator().manual_seed(seed)) * 0.02
    with torch.no_grad():
        for p in model.parameters():
            flat = p.view(-1)
            for a in range(0, flat.numel(), block.numel()):
                flat[a : a + block.numel()] = block[: flat.numel() - a]
    return model


def place_model(hf_home: Path, repo_id: str, source: Path, commit: str, move: bool = False) -> Path:
    """Copy (or move) `source` into the hub cache as `repo_id`'s snapshot `commit`, refs/main at it."""
    root = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snap = root / "snapshots" / commit
    if move:
        snap.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(source, snap)
    else:
        shutil.copytree(source, snap, dirs_exist_ok=True)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    return snap


def place_dataset(
    hf_home: Path, repo_id: str, subset: str, splits: dict[str, list[dict]], commit: str, work: Path
) -> Path:
    """`splits` ({split: rows}) as the datasets cache holds `repo_id`/`subset` after an online read
    of hub commit `commit`. `datasets` writes it (a local repository folder: parquet files and the
    README's loading config); it is then named as a hub read names it (ORG___NAME, the commit)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    name = repo_id.split("/")[1]
    repo = work / name
    (repo / subset).mkdir(parents=True, exist_ok=True)
    files = []
    for split, rows in splits.items():
        pq.write_table(pa.Table.from_pylist(rows), repo / subset / f"{split}-00000-of-00001.parquet")
        files.append(f"  - split: {split}\n    path: {subset}/{split}-*")
    (repo / "README.md").write_text(
        f"---\nconfigs:\n- config_name: {subset}\n  data_files:\n" + "\n".join(files) + "\n---\n"
    )
    import datasets

    cache = hf_home / "datasets"
    builder = datasets.load_dataset_builder(str(repo), subset, cache_dir=str(cache))  # a local folder: no network
    builder.download_and_prepare()
    built = builder.cache_dir
    target = cache / repo_id.replace("/", "___") / subset / "0.0.0" / commit
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(built, target)
    shutil.rmtree(cache / name, ignore_errors=True)
    return target


# ---- the test hub: fixtures of test_hub.py, test_hub_data.py and test_gsm8k.py ------------------
QWEN, LLAMA, RM, GSM8K = "Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.2-1B-Instruct", "org/tiny-rm", "openai/gsm8k"
COMMITS = {QWEN: "a1" * 20, LLAMA: "b2" * 20, RM: "c3" * 20, GSM8K: "d4" * 20}
LLAMA_SMALL = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96
)


@pytest.fixture(scope="session")
def hub_home(tmp_path_factory):
    """HF_HOME with a reduced Qwen2.5 (its tokenizer's template), a small Llama 3, a posttrain reward
    model and GSM8K-shaped rows, each under its hub id and a known commit."""
    import torch
    from safetensors.torch import save_file

    work, home = tmp_path_factory.mktemp("models"), tmp_path_factory.mktemp("hf_home")
    qwen = write_model(work / "qwen", "qwen", max_len=2048)  # room for the quickstart's 512 new tokens
    place_model(home, QWEN, qwen, COMMITS[QWEN])
    place_model(home, LLAMA, write_model(work / "llama", "llama3", LLAMA_SMALL, seed=1), COMMITS[LLAMA])
    rm = place_model(home, RM, qwen, COMMITS[RM])  # the trunk and a score head: an `rm` run's files
    save_file(
        {"weight": torch.linspace(-1, 1, 64)[None], "bias": torch.tensor([0.25])}, str(rm / "reward_head.safetensors")
    )
    rows = GSM8K_ROWS
    place_dataset(home, GSM8K, "main", {"train": rows[:9], "test": rows[9:]}, COMMITS[GSM8K], work)
    return home


@pytest.fixture
def offline(hub_home, monkeypatch):
    """This process reads `hub_home` with HF_HUB_OFFLINE=1 (environment and the clients' settings)."""
    return use_hub(hub_home, monkeypatch)


def use_hub(home: Path, monkeypatch) -> Path:
    """Point this process's huggingface_hub and `datasets` at `home`, offline, for one test."""
    import datasets.config
    import huggingface_hub.constants

    from posttrain.models import hub
    from posttrain.tasks import hub_data

    for k, v in {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home / "datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "_MODELS", {})
    monkeypatch.setattr(hub_data, "RECORDS", {})
    return home
