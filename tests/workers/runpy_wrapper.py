"""Run the script argv[1] through ``runpy``, as launchers and test harnesses do (Accelerate
runs its test scripts so), its own arguments after it."""

import runpy
import sys

if __name__ == "__main__":
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
