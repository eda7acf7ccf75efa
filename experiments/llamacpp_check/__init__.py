"""Checks of ferry against a second real engine, llama.cpp's ``llama-server``, built from PyPI's llama-cpp-python
sdist (``install_server.sh``) and serving random-weight Llamas written in GGUF (``tiny_model_gguf.py``)."""
