#!/usr/bin/env bash
# `make setup`, one environment:  tools/venv.sh NAME LOCK PYTHON_VERSIONS...
# Builds $VENV/NAME from the lock file LOCK (docs/design.md, "Environments") on one of the Python
# versions listed (those the lock is made for), then installs this project into it, editable and
# without dependencies (the lock has them all).
#   Python:    $PYTHON (the machine's python3) if listed, else python3.X on PATH, else one from uv;
#              a PYTHON other than python3 that does not run is an error.
#   Installer: uv ($UV, else uv on PATH): `uv pip sync` makes the environment exactly the lock;
#              without uv, venv + pip install the same lock.
# No listed Python to be had: MXNet is skipped with one line saying why (kept in $VENV/mxnet.skipped
# for make test / make compare) and the script succeeds; any other environment is an error.
#   tools/venv.sh --check-python: only the check of an explicit $PYTHON below (make setup runs it
#   before it installs uv with that Python).
set -euo pipefail
python=${PYTHON:-python3}

check_python() {  # an explicit PYTHON (not the default python3) must run, or setup stops here
  local out why
  [ "$python" = python3 ] && return 0  # the default: where it does not run, python3.X is looked for
  if ! command -v "$python" >/dev/null; then
    why="not a command on PATH"
  elif ! out=$(timeout 60 "$python" -c 'import sys' 2>&1 </dev/null); then
    out=${out%%$'\n'*}  # its first line: a pyenv shim of a version not installed says which
    why="it does not run (${out:-no output})"
  else
    return 0
  fi
  echo "error: PYTHON=$python: $why; name a Python that runs (PYTHON=python3.11), or leave PYTHON out to use python3" >&2
  exit 1
}
check_python
[ "${1:-}" = --check-python ] && exit 0

name=$1 lock=$2
shift 2
versions=("$@")
venv=${VENV:-.venv}/$name
uv=${UV:-}
[ -n "$uv" ] && [ -x "$uv" ] || uv=$(command -v uv || true)

listed() {  # listed PYTHON: it runs and is one of $versions
  local v
  v=$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || return 1
  [[ " ${versions[*]} " == *" $v "* ]]
}

find_python() {  # the machine's python3, else python3.X on PATH, else one that uv finds or fetches
  local p v
  for p in "$python" "${versions[@]/#/python}"; do
    # (the interpreter itself, not a pyenv shim in front of it)
    if listed "$p"; then "$p" -c 'import sys; print(sys.executable)'; return; fi
  done
  [ -n "$uv" ] || return 1
  # 3.11 where listed: the version the committed results were made with.
  v=${versions[-1]}
  [[ " ${versions[*]} " == *" 3.11 "* ]] && v=3.11
  # (its error, when it cannot download one, becomes the one line below; `uv python install` shows it)
  "$uv" python install -q "$v" >/dev/null 2>&1 && "$uv" python find --system "$v"
}

# torch's first install downloads several GB of CUDA wheels (they run on the CPU too)
[ "$name" = torch ] && [ ! -e "$venv" ] && big=" (first time: minutes, several GB)" || big=""
if [ -x "$venv/bin/python" ] && listed "$venv/bin/python"; then
  echo "== updating $venv from $lock"  # uv pip sync / pip change only what the lock changed
elif py=$(find_python) && [ -n "$py" ]; then
  version=$("$py" -c 'import platform; print(platform.python_version())')
  echo "== setting up $venv from $lock on Python $version ($py)$big"
  if [ -n "$uv" ]; then "$uv" venv -q --clear --python "$py" "$venv"; else "$py" -m venv --clear "$venv"; fi
else
  wanted="${versions[*]}"
  why="needs Python ${wanted// / or }, found none on PATH${uv:+ nor could uv fetch one}"
  if [ "$name" = mxnet ]; then
    # MXNet 1.9.1's numpy 1.23.5 has no wheels for newer Pythons; the rest runs without MXNet.
    why="$why; install python3.11 or uv, then make setup"
    echo "== MXNet skipped: $why"
    echo "$why" >"$venv.skipped"
    exit 0
  fi
  echo "error: $venv $why" >&2
  exit 1
fi

if [ -n "$uv" ]; then
  # uv reads no pip.conf: a package mirror configured for pip (index-url) serves uv too.
  mirror=${PIP_INDEX_URL:-$("$python" -m pip config get global.index-url 2>/dev/null || true)}
  [ -n "${UV_DEFAULT_INDEX:-}" ] || [ -z "$mirror" ] || export UV_DEFAULT_INDEX=$mirror
  # Bytecode compiled once here: where PYTHONDONTWRITEBYTECODE is set (containers, CI images)
  # Python writes none itself, and every process would compile torch's modules again as it
  # imports them (seconds per process: the tests start many).
  "$uv" pip sync -q --compile-bytecode --python "$venv/bin/python" "$lock"
  "$uv" pip install -q --python "$venv/bin/python" --no-deps -e .
else
  echo "== $venv: no uv, installing $lock with pip"
  [ -x "$venv/bin/pip" ] || "$venv/bin/python" -m ensurepip -q  # a venv that uv made has no pip
  # (a pip.conf with file:// indexes that lack a package makes pip warn once per package)
  quiet() { "$@" 2>&1 | { grep -v 'is neither a file nor a directory' || true; }; }
  quiet "$venv/bin/pip" install ${PIP_FLAGS:-} -r "$lock"
  quiet "$venv/bin/pip" install ${PIP_FLAGS:-} --no-deps -e .
fi
rm -f "$venv.skipped"
echo "$lock" >"$venv/.stamp"  # which lock: tests/fixtures/locks.py
