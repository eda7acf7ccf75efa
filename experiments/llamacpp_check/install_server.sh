#!/usr/bin/env bash
# Build llama.cpp's llama-server for this machine's CPU from PyPI alone: the sdist of llama-cpp-python (pinned, its
# SHA-256 checked) vendors llama.cpp, and only its llama-server target is built.
#   experiments/llamacpp_check/install_server.sh DEST [PYTHON]
# DEST gets bin/llama-server, gguf-py/ (the gguf package of the same llama.cpp: it writes the models it serves,
# experiments/llamacpp_check/tiny_model_gguf.py), LICENSE and BUILD (what was built, and how).
# cmake, Release: the CPU backend only, for this CPU (-march=native: the build is one per machine, ~/.cache/ferry),
# statically linked; no tests, examples, other tools or web UI (neither built with npm nor downloaded), no HTTPS
# (cpp-httplib without OpenSSL: this llama.cpp has no CURL option left, and the server only listens). About 10
# minutes with -j2; the compiler's output is kept out of the log unless the build fails.
set -euo pipefail
DEST=${1:?usage: install_server.sh DEST [PYTHON]}
PYTHON=${2:-python3}
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
SDIST=llama_cpp_python-$VERSION.tar.gz
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK"
echo "$SHA256  $WORK/$SDIST" | sha256sum --check --quiet
tar -xzf "$WORK/$SDIST" -C "$WORK"
SRC=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >"$WORK/cmake.log" 2>&1 ||
  { tail -40 "$WORK/cmake.log"; exit 1; }
cmake --build "$WORK/build" --target llama-server -j2 >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log"; exit 1; }
rm -rf "$DEST"
mkdir -p "$DEST/bin"
cp "$WORK/build/bin/llama-server" "$DEST/bin/"
cp -r "$SRC/gguf-py" "$DEST/gguf-py"
cp "$SRC/LICENSE" "$DEST/LICENSE"
{
  echo "llama-cpp-python $VERSION (sdist sha256 $SHA256), its vendored llama.cpp"
  grep -E '^(CMAKE_BUILD_TYPE|GGML_NATIVE|GGML_OPENMP|BUILD_SHARED_LIBS):' "$WORK/build/CMakeCache.txt"
  "$DEST/bin/llama-server" --version 2>&1
} >"$DEST/BUILD"
"$DEST/bin/llama-server" --version >/dev/null 2>&1
