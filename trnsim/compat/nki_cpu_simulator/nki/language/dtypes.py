"""``nki_cpu_simulator.nki.language.dtypes``: NKI's data types (``bfloat16``,
``float8_e4m3``, ...), the same objects as ``nki.language``'s, and their class ``dtype``."""

from __future__ import annotations

from trnsim.dtypes import DType
from trnsim.nki import language as _language

dtype = DType
# each data type nki.language names, its aliases too
globals().update({name: value for name, value in vars(_language).items() if isinstance(value, DType)})
