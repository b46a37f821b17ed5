"""flashrung: exact attention kernels in Triton and Gluon, and the instrument that proves them.

>>> import flashrung
>>> out = flashrung.attention(q, k, v, causal=True)      # q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D)
>>> flashrung.last_dispatch()                              # which kernel ran, and why
"""
from flashrung._version import __version__
from flashrung.api import attention, attention_varlen, flash_attn_func, flash_attn_varlen_func
from flashrung.dispatch import Dispatch, UnsupportedError, last_dispatch

__all__ = ["attention", "attention_varlen", "flash_attn_func", "flash_attn_varlen_func", "last_dispatch", "Dispatch",
           "UnsupportedError", "__version__"]
