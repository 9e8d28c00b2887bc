"""Readers of untrusted input: checkpoints, configs, GGUF files."""
