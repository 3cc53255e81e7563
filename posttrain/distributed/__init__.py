"""Scale-out: the same roles, placed differently (docs/architecture.md §8).

    placement.py      config → where the rollout role and the reference run, and how ❽ syncs
    async_rollout.py  asynchronous mode: a producer thread keeps rollouts coming into a
                        bounded queue, at most `max_staleness` policy versions behind
    ray_rollout.py    `placement: ray`: rollout workers as Ray actors (an Engine and a model
                        copy each), bucketed weight sync through the object store, restarts;
                        the reference as an actor
    data_parallel.py  the trainer as a torch.distributed group: gradients reduced once
    launch.py         N ranks: torchrun's processes join the run's process group (NCCL / gloo); scale.gpus
    ranks.py          a stage's trainer as one of N ranks: FSDP2-sharded (ShardedTrainer) or replicated
    fsdp.py           `trainer_shard: fsdp`: the policy sharded with FSDP2 (fully_shard), gathered into the sampler's copy
    run_summary.py    the step-time decomposition and the bottleneck role of a run

The weights' side of scale-out (versioned snapshots, the synchronous push, the broadcast
transport) lives with every other weight sync in framework/weight_sync/.

Nothing here is imported unless a config asks for it; Ray only by `ray_rollout.py`.
"""
