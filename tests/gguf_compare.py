"""The parity comparator lives in the package (dflash_convert.validate.compare); tests import it from here."""

from functools import partial

from dflash_convert.validate.compare import differences

# parity with upstream's converter or llama-quantize: general.* compared too, but for our provenance keys
parity_differences = partial(differences, general=True)

__all__ = ["differences", "parity_differences"]
