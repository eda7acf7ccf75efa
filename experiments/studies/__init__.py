"""Studies: experiments that answer one question with many runs and print a table (``python -m
experiments.studies.<name>``): paging against reservation (``paged_vs_static``), the simulator's speed (``bench``),
and the rate search they share (``ratesearch``)."""
