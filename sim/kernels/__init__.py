"""The compiled kernels both engines call, written once: the KV cache's state (``kvstate``) and every operation on it
(``kv``), the prefix index (``prefix``), conversations' turns (``sessions``), and how they are compiled (``jit``). The
reference engine reaches them through ``sim.kvcache``, ``sim.prefix_cache`` and ``sim.state``; the compiled engine's
twin (``sim.compiled``) and the compiled policies call them directly. Nothing here imports from either engine."""
