"""``import commrt`` imports no torch (its names load on first use), so that ``commrt
--help`` and a mistaken flag answer at once; and the ``"commrt"`` backend is registered
with torch.distributed whichever of the two a script imports first. Each case runs in a
fresh interpreter: this one has torch and commrt loaded already."""

import subprocess
import sys

import pytest


def run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["train", "--epohcs", "2"],
                                  ["bench", "allreduce", "--help"], ["simulate", "--help"]])  # fmt: skip
def test_help_and_a_mistaken_flag_import_no_torch(argv):
    out = run(
        "import sys\nfrom commrt.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print('torch imported:', 'torch' in sys.modules)"
    )
    assert out.strip().endswith("torch imported: False"), out


@pytest.mark.parametrize(
    "first", ["import commrt\nimport torch.distributed as dist", "import torch\nimport commrt",
              "import commrt\nimport torch\nimport torch.distributed as dist",
              "import commrt.distributed", "from commrt.distributed import Options",
              "import commrt.distributed.group"],
)  # fmt: skip
def test_the_backend_is_registered_whichever_comes_first(first):
    out = run(f"{first}\nimport torch.distributed as dist\nprint(dist.Backend.backend_list)")
    assert "'commrt'" in out, out


def test_every_public_name_loads_on_first_use():
    out = run(
        "import commrt\nnames = [n for n in commrt.__all__ if getattr(commrt, n) is None]\n"
        "print(names, sorted(set(commrt.__all__) - set(dir(commrt))))"
    )
    assert out.strip() == "[] []", out
    failed = subprocess.run([sys.executable, "-c", "import commrt; commrt.nothing"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "module 'commrt' has no attribute 'nothing'" in failed.stderr, failed.stderr
