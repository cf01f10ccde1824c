"""Search spaces: typed parameters, safe constraints, device limits, enumeration, sampling, encodings.

    from fleettune.space import SearchSpace, SpaceError, DeviceLimits, lookup_device
    space = SearchSpace.from_spec(spec.parameters, spec.constraints, lookup_device(product=label))
    rows = space.enumerate()            # int32 index rows
    space.to_configs(rows[:3])          # [{"block_size_x": 32, ...}, ...]

Kernel Tuner caches (`fleettune.space.kernel_tuner`) and T4 results (`fleettune.space.t4`), in
and out: `fleettune predict --cache` reads caches, `fleettune export` writes both. T1 specs are
read by a development tool, `fleettune_dev.interop`.
"""

from fleettune.space.devices import KNOWN_DEVICES, DeviceLimits, lookup_device
from fleettune.space.errors import SpaceError
from fleettune.space.expr import Constraint, parse_constraint
from fleettune.space.params import Parameter, parse_parameter
from fleettune.space.space import SearchSpace

__all__ = [
    "KNOWN_DEVICES",
    "Constraint",
    "DeviceLimits",
    "Parameter",
    "SearchSpace",
    "SpaceError",
    "lookup_device",
    "parse_constraint",
    "parse_parameter",
]
