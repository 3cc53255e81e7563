"""The controller (framework/controller.py) driven by fake roles that record every call.

Each fake implements its role's Protocol (framework/roles.py) and appends to one shared log, so
a test reads the step as the roles saw it: sample → reward → reference → advantages → train →
sync. The trainer's model is a real module whose parameters are checked bitwise and by version
counter after the step, and whose every forward is recorded: with the trainer and the sync as
no-ops, nothing else may have changed a weight, and the controller reaches the model only for
the off-policy correction's no-gradient scoring.
"""

import dataclasses

import torch

from posttrain.algorithms import grpo
from posttrain.config import RLConfig
from posttrain.framework.controller import Controller
from posttrain.framework.roles import PolicyTrainer, ReferenceScorer, RolloutEngine, RolloutSource, WeightSyncer
from posttrain.framework.sample import Sample
from posttrain.models.tokenizer import CharTokenizer
from posttrain.tasks.base import RewardResult

GROUPS, G, RESPONSE = 2, 3, [5, 6, 7]  # prompts per step, samples per prompt, every response's ids


class Log(list):
    def add(self, name: str) -> None:
        """Consecutive calls of one method count once: `task.reward` per sample reads as one stage."""
        if not self or self[-1] != name:
            self.append(name)


class FakeTask:
    """Task: item k is the number k; the reward of sample j in a group is j / (G - 1)."""

    name = "fake"

    def __init__(self, log: Log, rewards=None):
        self.log, self.rewards = log, rewards

    def items(self, n, split, seed):
        self.log.add("task.items")
        return list(range(n))

    def prompt(self, item):
        self.log.add("task.prompt")
        return f"q{item}"

    def reward(self, item, response):
        self.log.add("task.reward")
        j = int(response)  # the fake engine writes the sample index
        return RewardResult(self.rewards[j] if self.rewards is not None else j / (G - 1))


class FakeEngine:
    """RolloutEngine: every response is RESPONSE with logprob −0.5 per token; its text is the sample index."""

    def __init__(self, log: Log):
        self.log, self.policy_version, self.stats, self.prompts = log, 0, {"tokens_per_s": 1.0}, []
        self.max_len, self.tokenizer = 64, None

    def update_weights(self, weights, version=None) -> int:
        self.log.add("engine.update_weights")
        return 0

    def close(self) -> None:
        pass

    def generate(self, prompts, n, sampling, seed=0, step=0, items=None, group_offset=0, keep=None):
        self.log.add("engine.generate")
        self.prompts.append(prompts)
        return [
            Sample(
                prompt_ids=p,
                response_ids=list(RESPONSE),
                response_logprobs=[-0.5] * len(RESPONSE),
                response_mask=[1] * len(RESPONSE),
                finish_reason="stop",
                policy_version=self.policy_version,
                group=group_offset + g,
                index=j,
                item=items[g] if items else None,
                text=str(j),
            )
            for g, p in enumerate(prompts)
            for j in range(n)
        ]


class FakeReference:
    """ReferenceScorer: −1 on every loss-mask token; keeps the batch it was handed."""

    def __init__(self, log: Log):
        self.log, self.seen = log, None

    def score(self, batch):
        self.log.add("reference.score")
        self.seen = {k: v.clone() for k, v in batch.tensors().items()}
        return -1.0 * batch.loss_mask


class RecordingAlgorithm:
    """The algorithm role (a module in posttrain): GRPO's own math, each call logged."""

    def __init__(self, log: Log):
        self.log = log

    def advantages(self, rewards, group_index, cfg, **kw):
        self.log.add("algorithm.advantages")
        return grpo.advantages(rewards, group_index, cfg, **kw)

    def loss(self, *args):
        self.log.add("algorithm.loss")
        return grpo.loss(*args)


class FakeTrainer:
    """PolicyTrainer that trains nothing: it keeps the batch and the arguments it was handed.

    `model` maps a token to logits by an embedding (enough for a forward), and every read of
    the attribute and every forward is logged."""

    def __init__(self, log: Log, vocab: int):
        self.log, self.device, self.calls = log, torch.device("cpu"), []
        self.cfg = dataclasses.replace(RLConfig().optim, micro_batch_tokens=64)
        torch.manual_seed(0)
        self._model = torch.nn.Embedding(vocab, vocab)
        self._model.register_forward_pre_hook(
            lambda m, args: log.add("model.forward" + ("" if torch.is_grad_enabled() else " (no grad)"))
        )

    @property
    def model(self):
        self.log.add("trainer.model")
        return self._model

    def train(self, batch, loss_fn, epochs=1, minibatches=1, max_len=None):
        self.log.add("trainer.train")
        self.calls.append(({k: v.clone() for k, v in batch.tensors().items()}, epochs, minibatches, max_len))
        return {"loss": 0.25}


class FakeSync:
    def __init__(self, log: Log):
        self.log = log

    def sync(self):
        self.log.add("sync.sync")
        return {"sync/bytes": 0.0}


def make(overrides=None, reference=True, rewards=None):
    log, tok = Log(), CharTokenizer()
    cfg = RLConfig()
    cfg = dataclasses.replace(
        cfg,
        rollout=dataclasses.replace(
            cfg.rollout, prompts_per_step=GROUPS, samples_per_prompt=G, max_new_tokens=len(RESPONSE)
        ),
        optim=dataclasses.replace(cfg.optim, epochs=2, minibatches=3),
        verifier=dataclasses.replace(cfg.verifier, workers=0),  # the recording task (your code) scores here
    )
    for section, values in (overrides or {}).items():
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **values)})
    roles = dict(
        task=FakeTask(log, rewards),
        engine=FakeEngine(log),
        reference=FakeReference(log) if reference else None,
        algorithm=RecordingAlgorithm(log),
        trainer=FakeTrainer(log, tok.vocab_size),
        sync=FakeSync(log),
    )
    controller = Controller(
        cfg,
        roles["task"],
        tok,
        roles["engine"],
        roles["reference"],
        roles["algorithm"],
        grpo.Config(kl_coef=0.01),
        roles["trainer"],
        roles["sync"],
    )
    return controller, roles, log


def weights(model):
    return [(p.detach().clone(), p._version) for p in model.parameters()]


def unchanged(model, before) -> bool:
    return all(
        torch.equal(p, w) and p._version == v and p.grad is None for p, (w, v) in zip(model.parameters(), before)
    )


def test_the_fakes_satisfy_the_role_protocols():
    controller, roles, _ = make()
    assert isinstance(roles["engine"], RolloutEngine) and isinstance(roles["reference"], ReferenceScorer)
    assert isinstance(roles["trainer"], PolicyTrainer) and isinstance(roles["sync"], WeightSyncer)


def test_one_step_calls_the_roles_in_order_and_never_the_model():
    controller, roles, log = make()
    before = weights(roles["trainer"]._model)
    metrics = controller.step(4)
    assert log == [
        "task.items",
        "task.prompt",
        "engine.generate",
        "task.reward",
        "reference.score",
        "algorithm.advantages",
        "trainer.train",
        "sync.sync",
    ]
    assert unchanged(roles["trainer"]._model, before)  # not read (no trainer.model in the log), not written
    # what one role handed the next
    tok = CharTokenizer()
    assert roles["engine"].prompts == [[tok.encode(tok.chat_prompt(f"q{k}")) for k in range(GROUPS)]]
    ((batch, epochs, minibatches, max_len),) = roles["trainer"].calls
    assert (epochs, minibatches, max_len) == (2, 3, len(RESPONSE))
    assert torch.equal(roles["reference"].seen["input_ids"], batch["input_ids"])
    mask = batch["loss_mask"]  # [6, T]: the 3 response tokens
    assert mask.sum(1).tolist() == [3.0] * GROUPS * G
    assert torch.equal(batch["ref_logprobs"], -1.0 * mask)
    assert torch.equal(batch["old_logprobs"], -0.5 * mask)
    assert batch["rewards"].tolist() == [0.0, 0.5, 1.0] * GROUPS
    # GRPO: (r − mean) / (std + eps) per group on every response token; r − mean = (−.5, 0, .5), unbiased std .5
    expected = torch.tensor([-0.5, 0.0, 0.5] * GROUPS) / (0.5 + 1e-6)
    assert torch.allclose(batch["advantages"], expected[:, None] * mask)
    assert metrics["loss"] == 0.25 and metrics["sync/bytes"] == 0.0 and metrics["train/skipped_step"] == 0.0
    assert {"time/rollout_s", "time/reward_s", "time/reference_s", "time/train_s", "time/sync_s"} <= set(metrics)


def test_without_a_reference_the_batch_has_no_reference_logprobs():
    controller, roles, log = make(reference=False)
    controller.step(0)
    assert "reference.score" not in log and log[-2:] == ["trainer.train", "sync.sync"]
    assert "ref_logprobs" not in roles["trainer"].calls[0][0]


def test_the_off_policy_correction_reads_the_model_once_without_gradient_and_writes_nothing():
    controller, roles, log = make({"scale": {"off_policy_correction": "tis"}})
    before = weights(roles["trainer"]._model)
    controller.step(1)
    assert log == [
        "task.items",
        "task.prompt",
        "engine.generate",
        "task.reward",
        "reference.score",
        "algorithm.advantages",
        "trainer.model",
        "model.forward (no grad)",
        "trainer.train",
        "sync.sync",
    ]
    assert unchanged(roles["trainer"]._model, before)
    batch = roles["trainer"].calls[0][0]
    assert torch.equal(batch["behaviour_logprobs"], -0.5 * batch["loss_mask"])  # μ kept; old_logprobs ← π_prox


def test_an_async_source_replaces_the_rollout_and_is_the_sync():
    controller, roles, log = make()

    class Producer:  # samples made ahead by another thread
        def get(self, step):
            log.add(f"source.get({step})")
            samples = roles["engine"].generate([[1, 2]], G, None, items=[0])
            for s in samples:
                s.reward = float(s.index)
            return samples, {"async/staleness": 0.0}

        def sync(self):
            log.add("source.sync")
            return {}

    producer = Producer()
    assert isinstance(producer, RolloutSource) and isinstance(producer, WeightSyncer)
    controller.source = controller.sync = producer
    log.clear()
    metrics = controller.step(7)
    assert log == [
        "source.get(7)",
        "engine.generate",
        "reference.score",
        "algorithm.advantages",
        "trainer.train",
        "source.sync",
    ]
    assert metrics["async/staleness"] == 0.0


def test_a_step_whose_groups_are_all_degenerate_trains_and_syncs_nothing():
    controller, roles, log = make({"rollout": {"degenerate": "skip"}}, rewards=[1.0] * G)
    before = weights(roles["trainer"]._model)
    metrics = controller.step(2)
    assert log == ["task.items", "task.prompt", "engine.generate", "task.reward"]
    assert metrics["train/skipped_step"] == 1.0 and metrics["group/degenerate_frac"] == 1.0
    assert roles["trainer"].calls == [] and unchanged(roles["trainer"]._model, before)
