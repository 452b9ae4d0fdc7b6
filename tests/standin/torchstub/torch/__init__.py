"""A stub ``torch`` for the doctor and memory tests; the real torch is never installed here.

INDEXTTS_STANDIN_CUDA=1 makes CUDA "available" with one stand-in device and fixed memory
figures; otherwise only the CPU exists.  empty_cache() calls are recorded in
INDEXTTS_STANDIN_LOG like the stand-in indextts calls.
"""

import json
import os
import types

__version__ = "2.8.0+standin"

CUDA_ALLOCATED = 1_234_567
CUDA_RESERVED = 7_654_321


def _cuda_on():
    return os.environ.get("INDEXTTS_STANDIN_CUDA") == "1"


def _record(event):
    path = os.environ.get("INDEXTTS_STANDIN_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid()}) + "\n")


class _Cuda:
    @staticmethod
    def is_available():
        return _cuda_on()

    @staticmethod
    def is_initialized():
        return _cuda_on()

    @staticmethod
    def device_count():
        return 1 if _cuda_on() else 0

    @staticmethod
    def get_device_name(index=0):
        return "Stand-in GPU 24GB"

    @staticmethod
    def get_device_properties(index=0):
        return types.SimpleNamespace(name="Stand-in GPU 24GB", total_memory=24 * 1024**3)

    @staticmethod
    def memory_allocated(device=None):
        return CUDA_ALLOCATED

    @staticmethod
    def memory_reserved(device=None):
        return CUDA_RESERVED

    @staticmethod
    def empty_cache():
        _record("torch.cuda.empty_cache")


class _Mps:
    @staticmethod
    def is_available():
        return False


cuda = _Cuda()
backends = types.SimpleNamespace(mps=_Mps())
version = types.SimpleNamespace(cuda="12.8" if _cuda_on() else None)
