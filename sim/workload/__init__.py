"""Workloads: the requests a simulation replays, synthetic (``vllm bench serve`` style) or from a trace file.

- ``base``: the ``Workload`` value (three numpy columns and ids) and ``load_trace``;
- ``synthetic``: arrivals at a request rate and burstiness, lengths from ``LengthSpec``s;
- ``lengths``: token-length specs (fixed, uniform, lognormal, zipf, empirical) and length files;
- ``traces``: the trace formats (native, Azure, BurstGPT, Mooncake, Splitwise) and their checks;
- ``files``: opening any of them: compression and text encoding by their first bytes.

``from sim.workload import Workload, synthetic, load_trace, LengthSpec, parse_length_spec, FORMATS`` is the public
surface.
"""

from sim.workload.base import Workload, load_trace
from sim.workload.lengths import LengthSpec, parse_length_spec
from sim.workload.synthetic import synthetic
from sim.workload.traces import FORMATS

__all__ = ["FORMATS", "LengthSpec", "Workload", "load_trace", "parse_length_spec", "synthetic"]
