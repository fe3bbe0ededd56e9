"""Export: merge an adapter into its base (Hugging Face layout) and write GGUF files."""
