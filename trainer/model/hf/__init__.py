"""Hugging Face checkpoints: reading safetensors (read), the name map (names), import into megatron-core
(importer) and merging adapters back (merge)."""
