"""Calibration: measure a device's kernels with PyTorch and fit the roofline's curves and overheads to them.

Only ``ferry calibrate`` (and ``ferry validate``, through the kernels) uses this subpackage; a simulation needs only
``costmodel``'s roofline and a profile file. The pieces, in the order a calibration runs them:
``kernels`` (the torch kernels, shared with the real executor), ``grids`` (which sizes), ``device`` (what the device
is), ``timing`` (``Timer``, ``Pool``), ``harness`` (which kernels at which shapes, into rows), ``fit`` (the
non-negative least-squares fit of the curves), ``profile`` (held-out split, fit, score) and ``profile_data`` (the
profile's fields), ``vidur`` (reading Vidur's published measurements) and ``refit`` (fitting those).
"""
