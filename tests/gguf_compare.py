"""The parity comparator lives in the package (dflash_convert.checks.compare); tests import it from here."""

from dflash_convert.checks.compare import differences

__all__ = ["differences"]
