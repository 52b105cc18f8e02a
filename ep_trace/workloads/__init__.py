"""Reference expert-parallel MoE workload (needs torch)."""
