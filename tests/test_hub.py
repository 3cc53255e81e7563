"""Hub ids where a user names a model (models/hub.py): `init=`, `reward_model=`, the judge, `posttrain
eval`, `serve` and `export` take `org/name[@revision]`, resolved by huggingface_hub from its cache with
HF_HUB_OFFLINE=1 (no network: tests/hub_util.py lays the cache out as `snapshot_download` leaves it).

In this process the clients' settings are pointed at the test cache (they read HF_HOME and the
offline switches once, at import); the slow test runs the `posttrain` command in a fresh process
with only the environment variables set, as a user does.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("datasets")
import hub_util  # noqa: E402
from hub_util import COMMITS, GSM8K, LLAMA, QWEN, QWEN_05B, RM, hub_home, offline, use_hub  # noqa: E402, F401

from posttrain import UsageError, checkpoint  # noqa: E402
from posttrain.cli import main  # noqa: E402
from posttrain.config import RLConfig, load_config  # noqa: E402
from posttrain.models import hub  # noqa: E402
from posttrain.recipes.common import record_sources  # noqa: E402


def snapshot(home, repo):
    return home / "hub" / ("models--" + repo.replace("/", "--")) / "snapshots" / COMMITS[repo]


@pytest.mark.parametrize(
    "name,want",
    [
        ("Qwen/Qwen2.5-0.5B-Instruct", ("Qwen/Qwen2.5-0.5B-Instruct", None)),
        ("Qwen/Qwen2.5-0.5B-Instruct@main", ("Qwen/Qwen2.5-0.5B-Instruct", "main")),
        ("org/name@refs/pr/1", ("org/name", "refs/pr/1")),
        ("gpt2", None),  # a bare name is a path only
        ("runs/x/checkpoints", None),  # two slashes: a path
        ("./runs/sft", None),
        ("/abs/path", None),
        ("org/na--me", None),  # the hub refuses "--" in ids
    ],
)
def test_a_hub_id_has_one_slash_and_an_optional_revision(name, want):
    assert hub.parse_id(name) == want


def test_an_id_resolves_to_its_snapshot_and_a_local_path_wins(offline, tmp_path, monkeypatch):
    got = hub.resolve_model(QWEN, "init")
    assert got.local_dir == snapshot(offline, QWEN) and got.revision == COMMITS[QWEN]
    pinned = hub.resolve_model(f"{QWEN}@{COMMITS[QWEN]}")  # a commit hash: that snapshot
    assert pinned.local_dir == got.local_dir and pinned.record()["requested_revision"] == COMMITS[QWEN]
    local = tmp_path / "Qwen" / "Qwen2.5-0.5B-Instruct"  # the same name as a directory here: it wins
    local.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    mine = hub.resolve_model(QWEN)
    assert mine.local_dir == local.relative_to(tmp_path) and mine.revision is None


def test_a_name_that_resolves_nowhere_is_one_line_naming_both_tries(offline):
    with pytest.raises(UsageError) as e:
        checkpoint.load_model("Qwen/Qwen2.5-0.5B-Instrct", key="init")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("init='Qwen/Qwen2.5-0.5B-Instrct': no local path ")
    assert "Hugging Face Hub model Qwen/Qwen2.5-0.5B-Instrct@main failed (LocalEntryNotFoundError" in msg
    assert "HF_HUB_OFFLINE=1" in msg and "unset HF_HUB_OFFLINE" in msg
    with pytest.raises(UsageError, match=r"model Qwen/Qwen2.5-0.5B-Instruct@v9 failed .*HF_HUB_OFFLINE=1"):
        hub.resolve_model(f"{QWEN}@v9", "init")  # a revision not in the cache


@pytest.mark.parametrize(
    "offline_env,error,fix",
    [
        ("1", FileNotFoundError("outgoing traffic has been disabled"), "not in the cache"),
        (None, ConnectionError("Got: ConnectError: [Errno -2] Name or service not known"), "the hub is unreachable"),
        (None, PermissionError("403 Client Error: access to model org/x is restricted"), "set HF_TOKEN"),
        (None, OSError("404 Client Error: Repository Not Found"), "check the id (org/name[@revision])"),
    ],
)
def test_the_fix_matches_why_the_hub_refused(monkeypatch, offline_env, error, fix):
    if offline_env is None:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", offline_env)
    msg = str(hub.hub_failure("init", "org/x", "org/x@main", error))
    assert fix in msg and ("HF_HUB_OFFLINE=1" if offline_env else "HF_HUB_OFFLINE unset") in msg


def test_every_key_that_names_a_model_is_resolved_and_recorded_before_any_model_loads(offline, tmp_path, monkeypatch):
    """record_sources (called when a run starts) resolves init=, reward_model= and the judge by id and
    writes their commits to RUN_DIR/sources.json; a bad one fails there, before any weights load."""
    from posttrain.models import hf

    loads = []
    monkeypatch.setattr(hf, "load_hf", lambda *a, **k: loads.append(a))
    cfg = load_config(RLConfig, None, [f"init={QWEN}", f"reward_model={RM}", f"task.judge.model={LLAMA}"])
    got = record_sources(tmp_path, cfg)
    saved = json.loads((tmp_path / "sources.json").read_text())
    assert saved == got and loads == []
    assert {k: v["revision"] for k, v in saved.items()} == {
        "init": COMMITS[QWEN],
        "reward_model": COMMITS[RM],
        "task.judge.model": COMMITS[LLAMA],
    }
    assert saved["init"]["pinned"] == f"{QWEN}@{COMMITS[QWEN]}" and saved["init"]["path"] == str(
        snapshot(offline, QWEN)
    )
    for key in ("init", "reward_model", "task.judge.model"):
        bad = load_config(RLConfig, None, [f"{key}=org/missing"])
        with pytest.raises(UsageError, match=rf"^{key}='org/missing': no local path .* model org/missing@main failed"):
            record_sources(tmp_path / key, bad)
    assert loads == []


def test_init_the_judge_and_the_reward_model_load_by_id(offline):
    """The three entry points a run loads models through: checkpoint.load_model (init=), the judge's
    backend, the RM scorer (reward_model=); the RM's score equals its head on transformers' hidden
    state of the last token."""
    from posttrain.recipes.common import make_task
    from posttrain.reward_models.reward_model import load_scorer

    model, tok, path = checkpoint.load_model(QWEN, key="init")
    assert path == snapshot(offline, QWEN) and type(model.hf).__name__ == "Qwen2ForCausalLM"
    cfg = load_config(RLConfig, None, [f"task.judge.model={LLAMA}"])
    judge = make_task(cfg).backend  # the task with its judge, as every recipe makes it
    assert type(judge.model.hf).__name__ == "LlamaForCausalLM" and judge.name == str(snapshot(offline, LLAMA))
    assert judge.complete(["Is 3 + 4 = 7?"])[0] is not None
    scorer = load_scorer(RM)
    ids = scorer.tok.encode(scorer.tok.chat_prompt("2+2?") + scorer.tok.chat_response("4"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(snapshot(offline, RM), local_files_only=True).eval()
    with torch.no_grad():
        h = hf.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]  # [d]
    want = float(h @ torch.linspace(-1, 1, 64) + 0.25)
    assert scorer.score(["2+2?"], ["4"])[0] == pytest.approx(want, abs=1e-5)


def test_eval_and_export_take_an_id(offline, tmp_path, capsys):
    """`posttrain eval ID task…` on the hub dataset and `posttrain export ID`: the export is the model."""
    args = [f"task.train={GSM8K}", f"task.test={GSM8K}", "task.subset=main", "task.name=dataset"]
    out = tmp_path / "eval.json"
    assert main(["eval", QWEN, *args, "--problems", "2", "--k", "1", "--device", "cpu", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["checkpoint"] == str(snapshot(offline, QWEN)) and 0.0 <= res["eval/greedy_acc"] <= 1.0
    assert main(["export", LLAMA, "--format", "hf", str(tmp_path / "x")]) == 0
    a = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "x", local_files_only=True).eval()
    b = transformers.AutoModelForCausalLM.from_pretrained(snapshot(offline, LLAMA), local_files_only=True).eval()
    ids = torch.tensor([[5, 9, 40, 7]])
    with torch.no_grad():
        assert torch.equal(a(input_ids=ids).logits, b(input_ids=ids).logits)


def test_serve_takes_an_id(offline):
    """`posttrain serve ID`'s loader and app: an OpenAI chat request answered by the hub model."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from posttrain.serve.app import create_app
    from posttrain.serve.batcher import Batcher
    from posttrain.serve.server import Server, load_engine

    engine, tok = load_engine(QWEN, "cpu", 1, 8)
    batcher = Batcher(engine, 0)
    server = Server(create_app(batcher, tok, QWEN, engine.max_len)).start()
    try:
        body = {"model": QWEN, "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 4, "temperature": 0}
        r = httpx.post(server.url + "/chat/completions", json=body, timeout=30)
        assert r.status_code == 200 and r.json()["model"] == QWEN
    finally:
        server.close()
        batcher.close()


@pytest.mark.slow
def test_the_command_line_reads_the_hub_cache_from_the_environment(hub_home, tmp_path):
    """A fresh `posttrain` process with HF_HOME and HF_HUB_OFFLINE=1 set, nothing patched: RL from a
    hub model on a hub dataset writes the snapshot's commit to sources.json; eval takes the id too."""
    env = {**os.environ, "HF_HOME": str(hub_home), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("HF_HUB_CACHE", None)
    keys = ["task.name=dataset", f"task.train={GSM8K}", "task.subset=main", "verifier.workers=0"]
    run = [
        f"init={QWEN}",
        *keys,
        f"out={tmp_path}/rl",
        "steps=1",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=2",
        "rollout.max_new_tokens=8",
        "eval.problems=1",
        "eval.samples=1",
        "device=cpu",
        "threads=1",
    ]
    p = subprocess.run([sys.executable, "-m", "posttrain.cli", "rl", *run], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    saved = json.loads((tmp_path / "rl" / "sources.json").read_text())
    assert saved["init"]["revision"] == COMMITS[QWEN] and saved["task.train"]["revision"] == COMMITS[GSM8K]
    assert f"init: {QWEN}@{COMMITS[QWEN]}" in p.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "rl", "init=Qwen/Qwen2.5-7B-Instruct", *keys, f"out={tmp_path}/bad"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert bad.returncode == 2 and "init:" not in bad.stdout
    line = bad.stderr.strip().splitlines()[-1]
    assert (
        line.startswith("posttrain rl: error: init='Qwen/Qwen2.5-7B-Instruct': no local path")
        and "HF_HUB_OFFLINE=1" in line
    )


@pytest.mark.slow
def test_qwen2_5_0_5b_at_its_full_shape_loads_by_id(tmp_path, monkeypatch):
    """Qwen2.5-0.5B's published shape (hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864, vocabulary
    151,936, tied), randomly initialised, under its hub id: 494,032,768 parameters (its model card's
    0.49B), loaded by id and sampled by the engine through the fast decode path."""
    from posttrain.framework.rollout import Engine, SamplingParams

    work, home = tmp_path / "w", tmp_path / "home"
    src = hub_util.write_model(work / "q", "qwen", {**QWEN_05B, "vocab_size": 151936}, max_len=1024)
    commit = "e5" * 20
    hub_util.place_model(home, QWEN, src, commit, move=True)
    use_hub(home, monkeypatch)
    model, tok, path = checkpoint.load_model(QWEN, key="init")
    assert path.name == commit and model.num_params() == 494_032_768 and model.config.vocab_size == 151_936
    (s,) = Engine(model, tok).generate(
        [tok.encode(tok.chat_prompt("2+2?"))], 1, SamplingParams(0.0, max_new_tokens=3), 0
    )
    assert len(s.response_ids) >= 1
