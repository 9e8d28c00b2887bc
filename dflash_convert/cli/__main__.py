"""``python -m dflash_convert.cli``: the same program as the ``dflash-convert`` entry point."""

from . import main

main()
