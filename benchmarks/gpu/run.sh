#!/usr/bin/env bash
# graphpipe GPU readiness check (`make gpu-check`): pick a Python whose torch sees CUDA, make graphpipe
# importable without any package index, then run benchmarks/gpu/check.py (CUDA tests, multi-rank pipelines on
# the GPU(s) equal to one device, bf16, a CUDA profile, throughput against torch pipelining; results under
# benchmarks/gpu/results/). Exit 2 without CUDA, 1 if a check failed; stages that do not fit are skipped.
#   bash benchmarks/gpu/run.sh                        # PYTHON=/path/to/python chooses the interpreter
#   GPU_CHECK_ALLOW_CPU=1 bash benchmarks/gpu/run.sh  # rehearse every stage on CPU (gloo, small sizes)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
REPO="$(pwd -P)"
export GPU_CHECK_T0="${GPU_CHECK_T0:-$(date +%s)}"  # the driver's time budget counts from here

say() { printf '[gpu-check] %s\n' "$*"; }

# "cuda" or "cpu" for what python $1's torch sees; nothing when it cannot import torch.
probe() {
    timeout 120 "$1" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")' 2>/dev/null
}

# Sets PY and KIND: $PYTHON, else the project venv if its torch sees CUDA (or, rehearsing on CPU, has
# torch at all), else python3.
pick_python() {
    if [[ -n "${PYTHON:-}" ]]; then
        PY="$PYTHON"
        KIND="$(probe "$PY")"
        return
    fi
    if [[ -x .venv/bin/python ]]; then
        KIND="$(probe .venv/bin/python)"
        if [[ "$KIND" == cuda || ( "$KIND" == cpu && "${GPU_CHECK_ALLOW_CPU:-}" == 1 ) ]]; then
            PY=.venv/bin/python
            return
        fi
        [[ "$KIND" == cpu ]] && PASSED_OVER="; .venv/bin/python has torch without CUDA"
    fi
    PY=python3
    KIND="$(probe "$PY")"
}

# One line on stderr and exit 2 unless PY has torch with CUDA (or GPU_CHECK_ALLOW_CPU=1 and any torch).
require_cuda() {
    if ! command -v "$PY" >/dev/null 2>&1; then
        echo "gpu-check: no CUDA: there is no Python at '$PY' (set PYTHON to a Python with a CUDA build of torch)" >&2
        exit 2
    fi
    if [[ -z "$KIND" ]]; then
        echo "gpu-check: no CUDA: $PY cannot import torch${PASSED_OVER}" \
             "(set PYTHON to a Python with a CUDA build of torch)" >&2
        exit 2
    fi
    if [[ "$KIND" != cuda && "${GPU_CHECK_ALLOW_CPU:-}" != 1 ]]; then
        local version
        version="$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
        echo "gpu-check: no CUDA device: torch $version in $PY reports torch.cuda.is_available() == False" \
             "(set PYTHON to a Python with a CUDA build of torch, or GPU_CHECK_ALLOW_CPU=1 to rehearse on CPU)" >&2
        exit 2
    fi
}

# Where `import graphpipe` would come from, without importing it (empty: nowhere).
graphpipe_location() {
    (cd / && "$PY" -c 'import importlib.util as u, os
s = u.find_spec("graphpipe")
print(os.path.realpath(s.submodule_search_locations[0]) if s and s.submodule_search_locations else "")' 2>/dev/null)
}

# Make this tree's graphpipe importable: as it is, or `pip install --no-deps` (no index), else PYTHONPATH.
install_graphpipe() {
    local found
    found="$(graphpipe_location)"
    if [[ "$found" == "$REPO/graphpipe" ]]; then
        INSTALL="graphpipe already importable from this tree"
    elif [[ -n "$found" ]]; then
        export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
        INSTALL="another graphpipe is installed at $found; this tree is used through PYTHONPATH"
    else
        say "graphpipe is not importable: $PY -m pip install --no-deps --no-build-isolation --no-index -e ."
        local log
        log="$(mktemp -t gpu-check-pip.XXXXXX)"
        if timeout 120 "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
                --no-index -e . >"$log" 2>&1; then
            INSTALL="installed with pip install --no-deps --no-build-isolation --no-index -e ."
        else
            export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
            local why
            why="$(grep -m1 -E '^(error|ERROR)' "$log" || tail -n1 "$log")"
            INSTALL="pip install failed ($why); this tree is used through PYTHONPATH"
        fi
        rm -f "$log"
    fi
}

PASSED_OVER=""
pick_python
require_cuda
PY="$("$PY" -c 'import sys; print(sys.executable)')"
say "python: $PY"
SECONDS=0
install_graphpipe
say "$INSTALL"
export GPU_CHECK_INSTALL="$INSTALL" GPU_CHECK_INSTALL_S="$SECONDS" GPU_CHECK_INSTALL_STATUS=pass
"$PY" benchmarks/gpu/check.py
exit $?
