#!/usr/bin/env bash
# Real containers for the test suite, without a registry: installs podman (+ runc, podman-docker) from Debian's
# packages, writes /etc/containers/containers.conf for this machine kind, and builds ONE small local CPU image:
# a Debian rootfs (debootstrap) with python3 and the trainer's share of requirements/cpu.txt, pip-installed at
# the versions of this checkout's .venv (so the image runs what the suite tests on bare metal).
#
#   scripts/container-image.sh          install + configure + build what is missing; prints the image tag
#                                       (also starts podman's Docker-compatible API service, for a docker CLI)
#   scripts/container-image.sh tag      print the tag of the image (built or not)
#
# The image is cached: its tag is localhost/primus-cpu:<hash of the build steps, requirements/cpu.txt and the
# venv's pinned versions>, and nothing is rebuilt while that tag exists (older primus-cpu tags are removed).
# A second tag, localhost/primus-cpu-nomcore:<same hash>, is the same image with megatron-core uninstalled:
# the preflight's negative case. Needs root; facts behind the settings: ../shared/notes/containers-on-one-machine.md
# (crun refuses this machine's hybrid cgroups -> runc; podman's default RLIMIT_NOFILE raise is not permitted).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
ROOT=$PWD
STATE=${PRIMUS_CONTAINER_STATE:-/var/tmp/primus-container}
MIRROR=${PRIMUS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
PACKAGES=(podman runc podman-docker debootstrap)
MARK="# managed by primus-slurm scripts/container-image.sh"
# What the job imports (trainer/, megatron-core's undeclared triton/psutil): requirements/cpu.txt without the
# suite's own tools (pytest, pytest-timeout, pytest-xdist, matplotlib), plus PyYAML (the trainer reads its recipe
# with it).
NOT_IN_IMAGE='^(pytest|pytest-timeout|pytest-xdist|matplotlib)$'

say() { echo "container-image: $*" >&2; }
die() { say "error: $*"; exit 2; }

requirements() {  # the image's requirement names, one a line
  { sed -e 's/#.*//' -e 's/[[:space:]]//g' requirements/cpu.txt | grep -v '^$' | sed -E 's/[<>=!~;[].*//' \
      | grep -Ev "$NOT_IN_IMAGE"; echo PyYAML; } | sort -u
}

pins() {  # the venv's exact versions (name==version), so the image matches the tested bare-metal stack
  .venv/bin/python -m pip freeze --exclude-editable 2>/dev/null | grep -E '^[A-Za-z0-9_.-]+==' || true
}

tag() {
  local key
  # what decides the image's content: the build steps, the suite, the requirement list and the pinned versions
  key=$( { declare -f build requirements; echo "$SUITE $NOT_IN_IMAGE"; cat requirements/cpu.txt; pins; } \
    | sha1sum | cut -c1-12)
  echo "localhost/primus-cpu:$key"
}

install_packages() {  # all of PACKAGES, in one apt-get call when any is missing
  local have
  have=$(dpkg-query -W -f='${Status}\n' "${PACKAGES[@]}" 2>/dev/null | grep -c "install ok installed" || true)
  [ "$have" = "${#PACKAGES[@]}" ] && return 0
  command -v apt-get >/dev/null || die "apt-get not found; install ${PACKAGES[*]} by hand"
  say "installing ${PACKAGES[*]}"
  mkdir -p "$STATE"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"; } \
    >"$STATE/apt.log" 2>&1 || die "apt-get failed, see $STATE/apt.log"
}

configure() {
  local conf=/etc/containers/containers.conf
  mkdir -p /etc/containers
  if [ -f "$conf" ] && ! grep -qF "$MARK" "$conf"; then
    grep -q 'default_ulimits *= *\[\]' "$conf" && grep -q 'runtime *= *"runc"' "$conf" \
      || die "$conf exists and is not ours; it needs default_ulimits = [] under [containers] and runtime = \"runc\" under [engine]"
  else
    cat >"$conf" <<EOF
$MARK
[containers]
# podman raises the container's open-files limit by default; this machine kind does not permit it
default_ulimits = []

[engine]
# crun refuses cgroup v1 with a hybrid cgroup2 mount ("cgroups in hybrid mode not supported")
runtime = "runc"
EOF
  fi
  touch /etc/containers/nodocker  # podman-docker's `docker` prints a notice on every call otherwise
}

start_service() {  # podman's Docker-compatible API, for a real `docker` CLI (podman-docker points docker.sock at it)
  local pidfile="$STATE/podman-service.pid"
  if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    case "$(readlink "/proc/$(cat "$pidfile")/cwd")" in *" (deleted)") ;; *) return 0 ;; esac
    kill "$(cat "$pidfile")" 2>/dev/null; sleep 0.5  # alive in a deleted directory: start it again
  fi
  mkdir -p "$STATE" /run/podman
  # from /: the service outlives this script, and its containers' conmon needs a working directory that still exists
  # (started from a checkout deleted later, every `docker run` attach failed: "unable to upgrade to tcp, received 409")
  (cd / && exec setsid podman system service --time=0 unix:///run/podman/podman.sock >"$STATE/podman-service.log" 2>&1) &
  echo $! >"$pidfile"
  local i
  for i in $(seq 1 50); do [ -S /run/podman/podman.sock ] && return 0; sleep 0.2; done
  die "podman system service did not create /run/podman/podman.sock (see $STATE/podman-service.log)"
}

build() {  # build TAG
  local tag=$1 work="$STATE/build" rootfs wheels
  rootfs="$work/rootfs"; wheels="$work/wheels"
  rm -rf "$work"; mkdir -p "$work" "$wheels"
  local t0=$SECONDS wheel_pid
  requirements >"$wheels/requirements.txt"
  pins >"$wheels/constraints.txt"
  say "wheels for $(requirements | tr '\n' ' '), and debootstrap $SUITE (minbase + python3) from $MIRROR, at once"
  # the host's pip configuration (indexes, local wheel directories, ~/.cache/pip) resolves them, so the image
  # gets the same files the venv did; inside the chroot pip installs from this directory only
  .venv/bin/python -m pip wheel -q -w "$wheels" -r "$wheels/requirements.txt" -c "$wheels/constraints.txt" \
    >"$work/wheel.log" 2>&1 &
  wheel_pid=$!
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$SUITE" "$rootfs" "$MIRROR" \
    >"$work/debootstrap.log" 2>&1 || die "debootstrap failed, see $work/debootstrap.log"
  wait "$wheel_pid" || die "pip wheel failed, see $work/wheel.log"
  mkdir -p "$rootfs/wheels"
  mount --bind "$wheels" "$rootfs/wheels"
  mount -t proc proc "$rootfs/proc"
  trap 'umount "$rootfs/proc" 2>/dev/null; umount "$rootfs/wheels" 2>/dev/null' EXIT
  say "pip install into the image's /opt/venv ($((SECONDS - t0)) s)"
  chroot "$rootfs" /usr/bin/python3 -m venv /opt/venv
  chroot "$rootfs" /opt/venv/bin/python -m pip install -q --no-index --find-links /wheels \
    -r /wheels/requirements.txt -c /wheels/constraints.txt >"$work/pip.log" 2>&1 \
    || die "pip install in the image failed, see $work/pip.log"
  umount "$rootfs/proc"; umount "$rootfs/wheels"; trap - EXIT
  rmdir "$rootfs/wheels"
  rm -rf "$rootfs/var/cache/apt/archives"/*.deb "$rootfs/var/lib/apt/lists"/* "$rootfs/root/.cache"
  say "podman import $tag ($((SECONDS - t0)) s)"
  tar -C "$rootfs" -c . | podman import -q \
    --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$tag" >/dev/null
  # the preflight's negative case: the same image without megatron-core
  local nomcore=${tag/primus-cpu:/primus-cpu-nomcore:} box="primus-image-build-$$"
  podman run --name "$box" --network none "$tag" python3 -m pip uninstall -q -y megatron-core >/dev/null
  podman commit -q "$box" "$nomcore" >/dev/null
  podman rm -f "$box" >/dev/null
  mv "$work" "$work.old.$$" && { rm -rf "$work.old.$$" >/dev/null 2>&1 </dev/null & }  # 2 GB: off the critical path
  say "built $tag and $nomcore in $((SECONDS - t0)) s"
}

prune() {  # drop primus-cpu images of other hashes (each is ~2 GB)
  local keep=$1 img
  for img in $(podman images --format '{{.Repository}}:{{.Tag}}' | grep -E '^localhost/primus-cpu(-nomcore)?:' || true); do
    case "$img" in "$keep"|"${keep/primus-cpu:/primus-cpu-nomcore:}") ;; *) podman rmi -f "$img" >/dev/null 2>&1 || true ;; esac
  done
}

case "${1:-}" in
  tag) tag; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [tag]" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || die "must run as root (apt, /etc/containers, debootstrap)"
[ -x .venv/bin/python ] || die ".venv missing: run scripts/setup-env.sh first"
install_packages
configure
start_service
TAG=$(tag)
if ! podman image exists "$TAG" || ! podman image exists "${TAG/primus-cpu:/primus-cpu-nomcore:}"; then
  build "$TAG"
fi
prune "$TAG"
echo "$TAG"
