"""Tasks: prompts, gold answers and verifiers (reward functions). See tasks/base.py."""
