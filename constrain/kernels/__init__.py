"""Bitmask <-> logits kernels: apply a packed token bitmask to logits in place, batched, on numpy and torch."""

from constrain.kernels.bitmask import (
    allocate_token_bitmask,
    allowed_token_ids,
    apply_token_bitmask,
    apply_token_bitmask_torch,
    bitmask_to_bool,
    bitmask_width,
    bool_to_bitmask,
    count_allowed,
)

__all__ = [
    "allocate_token_bitmask",
    "allowed_token_ids",
    "apply_token_bitmask",
    "apply_token_bitmask_torch",
    "bitmask_to_bool",
    "bitmask_width",
    "bool_to_bitmask",
    "count_allowed",
]
