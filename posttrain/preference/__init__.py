"""Learning from preferences and from a teacher: preference pairs (data.py), the DPO family (dpo.py),
rejection sampling (rejection.py), on-policy distillation (distill.py) and test-time search (search.py).
The models that give rewards (the reward model, the PRM, the judge) are posttrain/reward_models/."""
