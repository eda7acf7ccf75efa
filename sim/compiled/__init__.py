"""The compiled engine: numba twins of the scheduler state (``state``), of the batch and its accounting (``batch``)
and of the engine's loop (``engine``), which give the reference engine's records to the last bit. The kernels both
engines share are ``sim.kernels``."""
