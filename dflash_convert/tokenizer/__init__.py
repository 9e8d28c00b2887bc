"""Borrow the target model's tokenizer for a drafter GGUF (``borrow.py``: borrow_from_dir, borrow_from_gguf).

Nothing is imported here: the probe's child process imports ``tokenizer.probe``, and a package
that re-exported ``borrow`` would make that child import every reader and numpy before it loads
the tokenizer.
"""
