"""Real execution: a Llama-style model with random weights (``llama``) and the executor that runs, in real time, the
batches a ferry policy chooses (``executor``). ``ferry calibrate`` and ``ferry validate`` use them; they need PyTorch.
"""
