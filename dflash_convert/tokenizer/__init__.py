"""Borrow the target model's tokenizer for a drafter GGUF."""

from .borrow import borrow_from_dir, borrow_from_gguf

__all__ = ["borrow_from_dir", "borrow_from_gguf"]
