#!/usr/bin/env bash
# A python with transformers 4.57.3 (what circuit-tracer 0.5 and TransformerLens 3 pin), for
# tests/checkpoints/test_transformers_versions.py; it prints that python's path:
#
#     export ANATOMY_TRANSFORMERS4_PYTHON=$(bash tests/checkpoints/transformers4_env.sh)
#
# transformers 4.57.3 pins huggingface-hub < 1 and tokenizers < 0.23, which an environment with
# transformers 5 cannot hold, so it gets a virtual environment of its own, under the anatomy cache
# (argument 1 names another folder). That environment sees the running python's packages (torch,
# safetensors, ...) through a .pth file and installs only transformers 4.57.3 and its pins: about
# 20 s and 60 MB, where a second torch would take minutes and a GB. Run again, it only re-points the
# .pth file at the running python (a CI checkout moves) and installs nothing.
set -euo pipefail
base=${PYTHON:-python}
venv=${1:-$("$base" -c 'from anatomy.checkpoints.files import cache_root; print(cache_root() / "venv-transformers4")')}
[ -x "$venv/bin/python" ] || "$base" -m venv "$venv" >&2
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$base" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/zz-anatomy-base.pth"
if ! "$venv/bin/python" -c 'import sys, transformers; sys.exit(transformers.__version__ != "4.57.3")' 2>/dev/null; then
    # pip's resolver lists the base's packages that want transformers 5 (sentence-transformers, ...):
    # shown only if the install fails
    if ! log=$("$venv/bin/python" -m pip install -q --disable-pip-version-check "transformers==4.57.3" 2>&1); then
        echo "$log" >&2
        exit 1
    fi
fi
echo "$venv/bin/python"
