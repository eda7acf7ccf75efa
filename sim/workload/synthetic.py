"""Synthetic workloads with ``vllm bench serve``'s conventions: request rate, burstiness, token-length specs.

Token lengths follow a ``LengthSpec`` (``sim.workload.lengths``). All randomness comes from the
``numpy.random.Generator`` passed in: same seed, same workload.
"""

from __future__ import annotations

import math

import numpy as np

from sim.workload.base import IntArray, Workload
from sim.workload.lengths import LengthSpec, parse_length_spec


def synthetic(
    num_prompts: int,
    request_rate: float,
    burstiness: float,
    input_len: LengthSpec | str | int,
    output_len: LengthSpec | str | int,
    rng: np.random.Generator,
    *,
    normalize: bool = True,
    pairs: tuple[IntArray, IntArray] | None = None,
) -> Workload:
    """``num_prompts`` requests arriving as ``vllm bench serve --request-rate R --burstiness B`` sends them.

    Gaps between requests are gamma(shape=B, scale=1/(R*B)): mean 1/R, coefficient of variation 1/sqrt(B);
    B=1 is a Poisson process, B<1 burstier, B>1 more regular, B=inf constant gaps of 1/R. R=inf sends all at
    t=0. As in vLLM (``vllm/benchmarks/serve.py``, ``get_request``), the first request also waits one gap (it
    does not arrive at 0), and with ``normalize`` (vLLM's behaviour without ramp-up) the arrival times are
    scaled by one factor so the last arrives at exactly ``num_prompts / R`` s: the achieved rate is exactly
    R, the gaps keep their gamma shape and CV. ``normalize=False`` gives the raw renewal process (for
    queueing-theory checks).

    ``pairs`` (prompt, output arrays, e.g. from ``sim.workload.lengths.read_length_pairs``) replaces the two length
    specs: each request takes one row, resampled with replacement, so prompt and output lengths keep their correlation.

    Draws, in this order, from ``rng`` only: the gaps, the prompt lengths, the output lengths (or the rows).
    """
    if isinstance(num_prompts, bool) or not isinstance(num_prompts, (int, np.integer)) or num_prompts < 1:
        raise ValueError(f"num_prompts={num_prompts!r} must be an integer >= 1")
    if not request_rate > 0:  # also refuses NaN
        raise ValueError(f"request_rate={request_rate} must be > 0 (inf sends every request at t=0)")
    if not burstiness > 0:
        raise ValueError(f"burstiness={burstiness} must be > 0 (1 is Poisson; inf is constant gaps)")
    in_spec, out_spec = parse_length_spec(input_len), parse_length_spec(output_len)

    n = int(num_prompts)
    if math.isinf(request_rate):
        arrival = np.zeros(n)
        process = "all at t=0"
    else:
        if math.isinf(burstiness):
            gaps = np.full(n, 1.0 / request_rate)
            process = f"constant rate={request_rate:g}/s"
        else:
            gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n)
            kind = "poisson" if burstiness == 1 else f"gamma(burstiness={burstiness:g})"
            process = f"{kind} rate={request_rate:g}/s"
        arrival = np.cumsum(gaps)
        if normalize and arrival[-1] > 0:
            arrival *= (n / request_rate) / arrival[-1]
    if pairs is not None:
        rows = rng.integers(0, len(pairs[0]), size=n)
        prompt, output = pairs[0][rows], pairs[1][rows]
        lengths = f"lengths=resampled pairs of {len(pairs[0])} rows"
    else:
        prompt, output = in_spec.sample(n, rng), out_spec.sample(n, rng)
        lengths = f"input={in_spec.text()} output={out_spec.text()}"
    source = f"synthetic {process} n={n} {lengths}"
    return Workload(arrival, prompt, output, None, source)
