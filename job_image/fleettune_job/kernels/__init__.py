"""The tunable kernels shipped in the job image.

``BUILTINS`` maps a kernel name (a TuningRun's ``kernel.builtin``) to its descriptor:
parameters with their value lists and defaults, search-space constraints, launch
geometry and the problem it solves. The operator and the docs list kernels from here.
"""

from __future__ import annotations

from fleettune_job.kernels.base import Constraint, KernelDescriptor, Parameter, Problem, Tensor
from fleettune_job.kernels.convolution import CONVOLUTION
from fleettune_job.kernels.gemm import GEMM
from fleettune_job.kernels.scan import SCAN

BUILTINS: dict[str, KernelDescriptor] = {k.name: k for k in (CONVOLUTION, GEMM, SCAN)}

__all__ = ["BUILTINS", "Constraint", "KernelDescriptor", "Parameter", "Problem", "Tensor"]
