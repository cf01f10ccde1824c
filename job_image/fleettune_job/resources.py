"""A compiled kernel's resources (registers, shared memory) against the device's limits.

The worker reads them from the loaded function; the batch supervisor from ptxas's report
when it compiles ahead (``-Xptxas=-v`` through NVRTC), so that a configuration that can
never launch is answered without the GPU. The check only refuses what is certain to fail
(the lower bound of what a block needs against the hard per-block limits); anything at
the margin goes to the GPU, whose answer is the truth.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Protocol


class Launch(Protocol):
    @property
    def grid(self) -> tuple[int, int, int]: ...

    @property
    def block(self) -> tuple[int, int, int]: ...

    @property
    def threads_per_block(self) -> int: ...


def describe_launch(launch: Launch, resources: Mapping[str, int]) -> str:
    g, b = launch.grid, launch.block
    text = f"grid {g[0]}x{g[1]}x{g[2]}, block {b[0]}x{b[1]}x{b[2]} = {launch.threads_per_block} threads"
    if "max_threads_per_block" in resources:
        text += f"; kernel allows at most {resources['max_threads_per_block']} threads per block"
    if "num_regs" in resources:
        text += f", uses {resources['num_regs']} registers/thread"
    if "shared_size_bytes" in resources:
        text += f", {resources['shared_size_bytes']} B static shared memory"
    return text


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_REGISTERS = re.compile(r"Used (\d+) registers")
_SHARED = re.compile(r"(\d+) bytes smem")
_STACK = re.compile(r"(\d+) bytes stack frame")


def ptxas_resources(log: str, function: str) -> dict[str, int]:
    """``num_regs``, ``shared_size_bytes`` and ``local_size_bytes`` of the entry ``function``
    from ptxas's verbose report; empty when the report does not name it."""
    found: dict[str, int] = {}
    entry = properties = None
    for line in log.splitlines():
        if match := _ENTRY.search(line):
            entry = match.group(1)
        elif match := _PROPERTIES.search(line):
            properties = match.group(1)
        elif (match := _STACK.search(line)) and properties == function:
            found["local_size_bytes"] = int(match.group(1))
        elif (match := _REGISTERS.search(line)) and entry == function:
            found["num_regs"] = int(match.group(1))
            shared = _SHARED.search(line)
            found["shared_size_bytes"] = int(shared.group(1)) if shared else 0
    return found if "num_regs" in found else {}


def over_limits(launch: Launch, resources: Mapping[str, int], limits: Mapping[str, int]) -> str | None:
    """Why the launch cannot succeed on a device with ``limits`` (cupy's device property
    names), or None when it may. Register allocation granularity is ignored on purpose:
    ``registers × threads`` is what a block needs at least."""
    threads = launch.threads_per_block
    max_threads = limits.get("maxThreadsPerBlock")
    if max_threads and threads > max_threads:
        return f"{threads} threads per block, the device allows at most {max_threads}"
    regs, regs_per_block = resources.get("num_regs"), limits.get("regsPerBlock")
    if regs and regs_per_block and regs * threads > regs_per_block:
        return (f"{regs} registers/thread x {threads} threads = {regs * threads} registers, "
                f"the device has {regs_per_block} per block")
    shared, shared_per_block = resources.get("shared_size_bytes"), limits.get("sharedMemPerBlock")
    if shared and shared_per_block and shared > shared_per_block:
        return f"{shared} B static shared memory, the device allows {shared_per_block} B per block"
    return None
