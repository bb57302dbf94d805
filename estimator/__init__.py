"""``infer estimate``: predict TTFT, TPOT, throughput, capacity and cost from a model's shape and a device."""

from .calibrate import fit
from .devices import DEVICES, Device, get_device
from .estimate import Workload, estimate
from .flops import decode_flops_per_token, prefill_flops
from .roofline import Deployment, Efficiency
from .shape import ModelShape, load_shape, parameter_count

__all__ = ["DEVICES", "Deployment", "Device", "Efficiency", "ModelShape", "Workload", "decode_flops_per_token",
           "estimate", "fit", "get_device", "load_shape", "parameter_count", "prefill_flops"]
