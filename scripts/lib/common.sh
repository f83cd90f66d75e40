# Shared by scripts/quickstart and scripts/setup (sourced, from the repository root).

# apt_install PACKAGE...: install Debian/Ubuntu packages when this is root with apt-get;
# otherwise say which to install and fail.
apt_install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    printf '\n==> installing %s (apt-get)\n' "$*" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  else
    echo "missing system packages: $* (install them, e.g. apt-get install $*)" >&2
    return 1
  fi
}

# apt_has PACKAGE: true when apt can install PACKAGE as a real package (not only a
# transitional one to a snap); reads the package lists, fetching them once if empty.
apt_has() {
  command -v apt-cache >/dev/null 2>&1 || return 1
  if [ -z "$(ls /var/lib/apt/lists 2>/dev/null | grep _Packages)" ] && [ "$(id -u)" = 0 ]; then
    apt-get update -qq
  fi
  apt-cache policy "$1" 2>/dev/null | grep -q 'Candidate: [0-9]' \
    && ! apt-cache show "$1" 2>/dev/null | grep -q '^Pre-Depends:.*snapd'
}

# make_venv: a .venv with pip, from $PYTHON (>= 3.11); installs python3-venv when the
# system Python cannot make one (Debian and Ubuntu ship venv support separately).
make_venv() {
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "runnerd needs Python >= 3.11"'
  if [ -d .venv ] && [ ! -x .venv/bin/pip ]; then
    printf '\n==> removing a broken .venv (it has no pip)\n' >&2
    rm -rf .venv
  fi
  [ -x .venv/bin/python ] && return
  printf '\n==> creating .venv\n' >&2
  if ! "$PYTHON" -m venv .venv >/dev/null 2>&1; then
    rm -rf .venv
    apt_install python3-venv || { echo "'$PYTHON -m venv' failed: install python3-venv" >&2; return 1; }
    "$PYTHON" -m venv .venv
  fi
}

# wait_ready URL [SECONDS]: wait until GET URL answers 200 (default 60 s; no curl needed).
wait_ready() {
  .venv/bin/python - "$1" "${2:-60}" <<'PY'
import sys, time, urllib.request
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=2) as answer:
            if answer.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.1)
sys.exit(1)
PY
}
