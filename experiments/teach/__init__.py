"""`ferry teach`: the teaching figures of the ferry analogy, drawn from ferry's own records of small scenarios."""
