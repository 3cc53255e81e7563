"""Rewards from preferences: preference pairs (data.py), the DPO family (dpo.py), the
Bradley–Terry / ORM reward model (reward_model.py)."""
