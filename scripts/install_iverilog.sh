#!/usr/bin/env bash
# Install Icarus Verilog (iverilog, vvp) with apt-get when it is missing and we are
# root. Anything else only warns: the Icarus tests then skip (or fail under CI=true).
set -euo pipefail

if command -v iverilog >/dev/null 2>&1 && command -v vvp >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "warning: Icarus Verilog is not installed; install it with" \
         "'sudo apt-get install iverilog' (or your system's package manager)." >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
echo "Installing Icarus Verilog (apt-get install -y iverilog)"
# The package lists may be missing or stale (fresh containers): update only then.
apt-get install -y iverilog || { apt-get update && apt-get install -y iverilog; }
