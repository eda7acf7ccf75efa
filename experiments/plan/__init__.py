"""`ferry plan`: the fewest GPUs, of which kind and with which settings, that serve a workload within an SLO."""
