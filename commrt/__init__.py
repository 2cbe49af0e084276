"""commrt: communication runtime for data-parallel training."""
