"""The parity comparator lives in the package (dflash_convert.validate.compare); tests import it from here."""

from dflash_convert.validate.compare import differences

__all__ = ["differences"]
