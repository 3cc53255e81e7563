"""Data curation for RL prompts (pass-rate probe, dedup, decontamination, band filter). See curate.py."""
