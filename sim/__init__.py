"""The simulator: requests (``request``), the KV-cache manager (``kvcache``), the scheduler state (``state``), the
SimPy engine (``engine``) and its compiled twin (``compiled/``), the compiled kernels both engines call (``kernels/``:
the KV cache, the prefix index, conversations), records and the metrics derived from them
(``records``, ``metrics``), and workloads (``workload/``)."""

from costmodel.moved import alias as _alias

# modules that moved into subpackages: their old import paths keep working (see costmodel.moved)
_alias(
    {
        "sim.fast_engine": "sim.compiled.engine",
        "sim.fast_state": "sim.compiled.state",
        "sim.traces": "sim.workload.traces",
        "sim.lengths": "sim.workload.lengths",
        "sim.compiled.jit": "sim.kernels.jit",
        "sim.compiled.kv": "sim.kernels.kv",
        "sim.compiled.kvstate": "sim.kernels.kvstate",
        "sim.compiled.prefix": "sim.kernels.prefix",
        "sim.compiled.sessions": "sim.kernels.sessions",
    }
)
