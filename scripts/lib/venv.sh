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
