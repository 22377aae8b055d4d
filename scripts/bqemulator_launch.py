"""Starts bqemulator with room for as many open AppendRows connections as the suite opens.

bqemulator serves each AppendRows bidi stream from a thread of asyncio's default executor,
which holds the thread for as long as the connection stays open (the gateway keeps one per
pending stream until it finalizes). The default executor has min(32, CPUs + 4) threads, six
on a 2-CPU machine, so a seventh open stream starves and its appends are never acknowledged.
BigQuery serves thousands of connections per project; this launcher gives the emulator a
larger default executor and otherwise runs its CLI unchanged.
"""

import asyncio
import concurrent.futures
import sys
from collections.abc import Callable
from typing import TypeVar, TypeVarTuple

OPEN_STREAMS = 256

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

_run_in_executor = asyncio.BaseEventLoop.run_in_executor


def _run_in_wide_executor(
    loop: asyncio.BaseEventLoop,
    executor: concurrent.futures.Executor | None,
    func: Callable[[*_Ts], _T],
    *args: *_Ts,
) -> asyncio.Future[_T]:
    if executor is None and getattr(loop, "_default_executor", None) is None:
        loop.set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=OPEN_STREAMS, thread_name_prefix="asyncio")
        )
    return _run_in_executor(loop, executor, func, *args)


# setattr, not an assignment: replacing a method of a class is what this launcher is for.
setattr(asyncio.BaseEventLoop, "run_in_executor", _run_in_wide_executor)

# Imported after the patch, so that the event loop bqemulator creates uses it.
from bqemulator.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
