"""Models: the built-in gpt_mini, its tokenizer, and adapters for Hugging Face models."""
