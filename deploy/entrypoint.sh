#!/bin/sh
# The runnerd image's entrypoint (deploy/Containerfile; docs/CONTAINERS.md). It runs the
# command it is given ("runnerd serve") under tini, after two things a container needs:
#
# - cgroups for jails' limits. In a container's own cgroup namespace (cgroup v2, Docker's
#   and Podman's default) the container is one cgroup, mounted read-only: it is remounted
#   read-write (needs CAP_SYS_ADMIN and no AppArmor mount rule in the way), tini moves to
#   <cgroup>/init and runnerd starts in <cgroup>/runnerd, so that each cgroup that hands
#   controllers down has no process of its own (cgroup v2's rule); runnerd then makes
#   runnerd/daemon and runnerd/jails itself. Anything refused: runnerd serves with
#   rlimits only and says so (/readyz's checks.cgroups is "none").
# - SESSION_KEY_FILE (optional): copied to <data dir>/session.key, so that every node
#   signs Manage-page cookies with the same key (docs/SCALING.md).
#
# ENTRYPOINT_CGROUP_ROOT (default /sys/fs/cgroup) and ENTRYPOINT_INIT (default tini) are
# for tests/test_cluster_balancer.py, which runs this script on a fake cgroup tree.
set -eu

say() { echo "runnerd-entrypoint: $*" >&2; }

root=${ENTRYPOINT_CGROUP_ROOT:-/sys/fs/cgroup}
init=${ENTRYPOINT_INIT:-tini}
into=

own=$(sed -n 's/^0:://p' /proc/self/cgroup)
if [ -f "$root/cgroup.controllers" ] && [ -n "$own" ]; then
  base="$root${own%/}"
  if [ ! -w "$base/cgroup.procs" ]; then
    mount -o remount,rw "$root" 2>/dev/null || true
  fi
  wanted=
  for controller in memory pids cpu; do
    if grep -qw "$controller" "$base/cgroup.controllers" 2>/dev/null; then
      wanted="$wanted +$controller"
    fi
  done
  if mkdir -p "$base/init" "$base/runnerd" 2>/dev/null \
    && echo $$ >"$base/init/cgroup.procs" 2>/dev/null \
    && echo "$wanted" >"$base/cgroup.subtree_control" 2>/dev/null; then
    into="$base/runnerd"
  else
    say "cgroup v2 at $root is not writable here: jails get rlimits only (docs/CONTAINERS.md)"
  fi
fi

if [ -n "${SESSION_KEY_FILE:-}" ]; then
  data=${RUNNERD_DATA_DIR:-/var/lib/runnerd}
  mkdir -p -m 0700 "$data"
  install -m 0600 "$SESSION_KEY_FILE" "$data/session.key"
fi

# tini reaps what is left to it and passes SIGTERM on (a stop drains: docs/INSTALL.md);
# when runnerd dies, tini exits, the container's pid namespace ends, and every jail with it.
export ENTRYPOINT_INTO="$into"
exec "$init" -- /bin/sh -c '
  [ -z "$ENTRYPOINT_INTO" ] || echo $$ >"$ENTRYPOINT_INTO/cgroup.procs"
  unset ENTRYPOINT_INTO
  exec "$@"' runnerd "$@"
