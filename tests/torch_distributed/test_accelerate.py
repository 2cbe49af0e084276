"""The README's Accelerate recipe, run as written under torchrun on 2 CPU ranks: Accelerate
sees MULTI_CPU over the commrt group and the ranks end with equal parameters. Without
``cpu=True`` it runs each rank alone, and commrt warns at exit."""

import json
import os
import re
import socket
import subprocess
import sys

import pytest

pytest.importorskip("accelerate")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT = """
import json, os, sys
state = {"type": str(accelerator.distributed_type), "n": accelerator.num_processes,
         "params": [p.detach().flatten().tolist() for p in model.parameters()]}
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as f:
    json.dump(state, f)
dist.destroy_process_group()
"""


def _recipe() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return next(b for b in blocks if "Accelerator(" in b)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(script: str, tmp_path):
    path = tmp_path / "train.py"
    path.write_text(script + REPORT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-port", str(_port()), str(path), str(tmp_path)]
    env = dict(os.environ, OMP_NUM_THREADS="1", COMMRT_ALGORITHM="ring", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    return ranks, proc.stderr


def test_readme_recipe_gives_multi_cpu_and_equal_parameters(tmp_path):
    ranks, err = _torchrun(_recipe(), tmp_path)
    assert [r["type"] for r in ranks] == ["DistributedType.MULTI_CPU"] * 2
    assert [r["n"] for r in ranks] == [2, 2]
    assert ranks[0]["params"] == ranks[1]["params"]
    assert "Accelerate ran this rank alone" not in err


@pytest.mark.slow
def test_accelerator_without_cpu_true_is_warned_of(tmp_path):
    script = _recipe().replace("Accelerator(cpu=not torch.cuda.is_available())", "Accelerator()")
    ranks, err = _torchrun(script, tmp_path)
    assert [r["type"] for r in ranks] == ["DistributedType.NO"] * 2
    assert ranks[0]["params"] != ranks[1]["params"]  # what the warning is about
    assert err.count("Accelerate ran this rank alone") == 2
    assert "Accelerator(cpu=True)" in err
