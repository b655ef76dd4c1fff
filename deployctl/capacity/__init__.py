"""Capacity: how many KV blocks and concurrent sequences fit on a GPU, and the engine settings that fit.

- ``formula``   the KV-cache formula and the plan (``tests/data/capacity_vectors.json`` pins it).
- ``modelinfo`` a model's shape from its config.json and safetensors headers.
- ``sizing``    a plan for deploy.yaml's engine settings on a GPU of a given size.
- ``initfile``  the deploy.yaml that ``deployctl init`` writes for a model.
"""
from deployctl.capacity.formula import (CapacityInputs, CapacityPlan, kv_bytes_per_token, num_kv_blocks, plan_capacity,
                                        verdict)

__all__ = ["CapacityInputs", "CapacityPlan", "kv_bytes_per_token", "num_kv_blocks", "plan_capacity", "verdict"]
