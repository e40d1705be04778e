"""Run an example script on `transformers.Trainer` under torchrun, destroying the process group at exit.

Why: HF's Trainer (through accelerate) never destroys the gloo process group it created, so at interpreter exit
torch's static destructors can meet gloo's still-joinable threads and abort the process ("terminate called without
an active exception", SIGABRT) after the script has finished and written everything. On a loaded machine this
happened in about 1 of 6 oracle runs. Lightning registers the same `destroy_process_group` at exit (lightning#19931),
so our side of the comparison never needs this; the oracle is made right here rather than retried.

Usage (as torchrun's script): oracle_clean_exit.py SCRIPT [SCRIPT ARGS...]
"""

import atexit
import os
import runpy
import sys

import torch.distributed as dist


def _destroy() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    atexit.register(_destroy)
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # the script imports its neighbours (_common)
    runpy.run_path(script, run_name="__main__")
