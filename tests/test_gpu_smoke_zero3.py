"""ZeRO-3 generation with the engine's fetch hooks taken off (rl.distributed.gathered with the engine):
a real DeepSpeed ZeRO-3 engine on this CPU (gloo, one process), through scripts/gpu_smoke_zero3.py."""

import json
import os
import sys
from pathlib import Path

import pytest
from _procs import run_tree

pytest.importorskip("deepspeed", reason="needs the [deepspeed] extra")

ROOT = Path(__file__).resolve().parents[1]


def test_hooks_come_off_for_generation_and_back_for_training():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = run_tree([sys.executable, str(ROOT / "scripts" / "gpu_smoke_zero3.py"), "--hidden", "32",
                     "--layers", "2", "--new_tokens", "12", "--repeats", "1"], 600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["tokens_equal"] is True
    # two layers of a Llama: the engine hooks every submodule, before and after its forward
    assert result["hooks_before"] > 20
    assert result["hooks_inside_on"] == result["hooks_before"]
    assert result["hooks_inside_off"] < result["hooks_before"] // 10
    assert result["hooks_after"] == result["hooks_before"]
    assert result["train_step_after"]["max_weight_change"] > 0


def test_a_bad_check_fails():
    """The script's own checks can fail: a hook count that does not come back is reported, exit 1."""
    code = (
        "import sys; sys.argv=['x','--hidden','32','--layers','1','--new_tokens','4','--repeats','1'];"
        "import runpy, deepspeed.runtime.zero.parameter_offload as po;"
        "po.DeepSpeedZeRoOffload._register_deepspeed_module = lambda self, module, count=[0]: None;"
        "runpy.run_path('scripts/gpu_smoke_zero3.py', run_name='__main__')"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = run_tree([sys.executable, "-c", code], 600, env=env, cwd=ROOT)
    assert proc.returncode != 0
    assert "hooks:" in proc.stderr


def test_deepspeed_on_a_cpu_compiles_no_shared_memory_op_and_takes_no_cache_lock(tmp_path):
    """rl.distributed.without_shm_op: DeepSpeed's process-group init on a CPU would build (or load,
    under a lock file in torch's extension cache) its shared-memory all-reduce; after the call it
    does neither, so a lock left by a killed process cannot stall a later launch."""
    import shutil

    code = ("import deepspeed.ops as ops; from deepspeed.comm.torch import build_shm_op;"
            "from rl.distributed import without_shm_op;"
            "before = ops.__compatible_ops__['deepspeed_shm_comm']; without_shm_op(); print(before, build_shm_op())")
    extensions = tmp_path / "torch_extensions"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TORCH_EXTENSIONS_DIR": str(extensions)}
    proc = run_tree([sys.executable, "-c", code], 300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, built = proc.stdout.split()[-2:]
    if shutil.which("g++"):  # with a compiler DeepSpeed would build the op: the call is what stops it
        assert before == "True"
    assert built == "None"
    assert not extensions.exists() or not any(extensions.iterdir())
