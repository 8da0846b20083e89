"""How a spawned gloo rank of the CPU tests ends: a barrier, then os._exit.

gloo's ProcessGroup destructor joins its worker thread while holding the GIL, and a worker thread
still releasing a finished collective's tensors (an all_gather's, held by the barrier's work
object) waits for the GIL: a deadlock at teardown. It hung a test now and then (session 40), and
twice in session 41 in the DDP test, whose Reducer held the last reference to the group and
destroyed it at the function's exit, after destroy_process_group. A rank has nothing left to do
after the barrier, so it skips the destructors; an exception on its way out is printed and gives
the exit status 1, which mp.spawn reports.
"""

from __future__ import annotations

import os
import sys
import traceback

import torch.distributed as dist


def leave_group_and_exit() -> None:
    """Call in a `finally:` at the end of a spawned rank's function (after its results are
    written): never returns."""
    failing = sys.exc_info()[0] is not None
    if failing:
        traceback.print_exc()
    try:
        dist.barrier()  # every rank's collectives done before any rank goes
    except Exception:
        traceback.print_exc()
        failing = True
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if failing else 0)
