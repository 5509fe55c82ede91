#!/usr/bin/env bash
# Builds the container images from this checkout with docker or podman, whichever works here:
#   reduction-server/reducer:TAG   docker/reducer.Dockerfile (python:3.11-slim)
#   reduction-server/worker:TAG    docker/worker.Dockerfile  (pytorch/pytorch:...-runtime)
#
# usage: scripts/build-images.sh [--engine docker|podman] [--tag TAG] [--only reducer|worker]
#                                [--worker-base IMAGE] [--no-stand-in] [--keep-build-stage]
#                                [--print-engine]
#   --engine E       default $RS_IMAGE_ENGINE, else docker when its daemon answers, else podman
#   --tag TAG        default $RS_IMAGE_TAG, else latest
#   --only NAME      build one image
#   --worker-base B  the worker's BASE (a PyTorch image; default: the Dockerfile's)
#   --no-stand-in    fail when a FROM image cannot be pulled, instead of building a stand-in
#   --keep-build-stage  keep the untagged build-stage images (see below) as a layer cache
#   --print-engine   print the engine command line (line 1) and the `run` flags this machine
#                    needs (line 2), then exit; tests/deploy/test_container_job.py runs containers so
#
# Stand-in bases: when a FROM image is neither local nor pullable (no registry reachable), a
# Debian bookworm root file system with python3 (3.11), pip and venv is made with mmdebstrap
# from Debian's mirror ($RS_DEBIAN_MIRROR, default http://deb.debian.org/debian), imported and
# tagged with the base's name (localhost/python:3.11-slim, localhost/pytorch/pytorch:...), with
# the label io.reduction-server.stand-in. The PyTorch stand-in is the same file system: it has
# NO PyTorch and no CUDA, so the worker image is then built without the [torch] extra (numpy
# example and NCCL plugin only). Every run that uses a stand-in says so in a banner.
#
# pip inside the build gets the host's settings: index-url / extra-index-url / trusted-host /
# find-links (PIP_* variables, else pip's configuration files) in a pip.conf passed as the build
# secret pip_conf, the CA bundle (pip's `cert`, else REQUESTS_CA_BUNDLE / SSL_CERT_FILE) as the
# secret pip_cert; secrets stay out of the image and its history. file:// indexes are
# mounted read-only into the build with podman; docker build cannot mount them, so they are
# left out (with a message) and the other indexes are used.
#
# What a build leaves: the named images and the bases, nothing untagged. Each Dockerfile's
# `build` stage (compiler, headers, the wheel: about 600 MB) carries the label
# io.reduction-server.build-stage; podman (and docker without BuildKit) keeps that stage as an
# untagged `<none>` image, so after every image is built the untagged images with that label are
# removed (--keep-build-stage keeps them: a rebuild then skips the compiler's apt-get; ccache's
# cache mount survives either way). An image of the same name that a rebuild replaced is removed
# too when nothing else names it and no container uses it. No other image is ever removed.
#
# Exit status: 0 built; 3 no container engine can build or run images here (the reason is
# printed; tests skip on it); 1 any other failure.
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE="${RS_IMAGE_ENGINE:-}"
TAG="${RS_IMAGE_TAG:-latest}"
ONLY=""
WORKER_BASE=""
STAND_IN=1
KEEP_BUILD_STAGE=0
PRINT_ENGINE=0
MIRROR="${RS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${RS_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
STAND_IN_LABEL="io.reduction-server.stand-in"
STAND_IN_IMAGE="localhost/reduction-server/stand-in-base:bookworm"
BUILD_STAGE_LABEL="io.reduction-server.build-stage"  # LABEL of both Dockerfiles' build stage

say() { echo "build-images: $*" >&2; }
die() { say "error: $*"; exit 1; }
unusable() { say "no usable container engine: $*"; exit 3; }

banner() {
  local line="################################################################################"
  { echo "$line"; for l in "$@"; do echo "# $l"; done; echo "$line"; } >&2
}

while [ $# -gt 0 ]; do
  case "$1" in
    --engine) ENGINE="$2"; shift 2 ;;
    --tag) TAG="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    --worker-base) WORKER_BASE="$2"; shift 2 ;;
    --no-stand-in) STAND_IN=0; shift ;;
    --keep-build-stage) KEEP_BUILD_STAGE=1; shift ;;
    --print-engine) PRINT_ENGINE=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
case "$ONLY" in ""|reducer|worker) ;; *) die "--only takes reducer or worker, not $ONLY" ;; esac

# -- the engine and the flags this machine needs ---------------------------------------------

ENG=()        # the engine command with its global flags
RUN_FLAGS=()  # flags for `run` and `build` (podman: ulimits the host allows)

# A limit for --ulimit: the host's, "unlimited" replaced by `cap`.
host_limit() { local v; v="$(ulimit "$1" "$2")"; [ "$v" = unlimited ] && v="$3"; [ "$v" -gt "$3" ] && v="$3"; echo "$v"; }

podman_flags() {
  ENG=(podman)
  # crun refuses cgroups v1 / hybrid hierarchies (seen with Debian's podman 4.3): use runc there.
  if [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" != cgroup2fs ] && command -v runc >/dev/null 2>&1; then
    ENG+=(--runtime runc)
  fi
  # No systemd as init: cgroupfs, and events to a file instead of the journal.
  [ -d /run/systemd/system ] || ENG+=(--cgroup-manager cgroupfs)
  [ -S /run/systemd/journal/socket ] || ENG+=(--events-backend file)
  # podman's default ulimits (nofile 1048576, ...) above the host's hard limits make setrlimit
  # fail in the container; nproc may not exceed kernel.pid_max.
  local pid_max big=1048576 nofile_s nofile_h nproc_s nproc_h
  pid_max="$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo 32768)"
  nofile_h="$(host_limit -H -n "$big")"; nofile_s="$(host_limit -S -n "$nofile_h")"
  nproc_h="$(host_limit -H -u "$pid_max")"; nproc_s="$(host_limit -S -u "$nproc_h")"
  RUN_FLAGS=(--ulimit "nofile=$nofile_s:$nofile_h" --ulimit "nproc=$nproc_s:$nproc_h")
}

pick_engine() {
  if [ -z "$ENGINE" ]; then
    if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then ENGINE=docker
    elif command -v podman >/dev/null 2>&1; then ENGINE=podman
    elif command -v docker >/dev/null 2>&1; then
      unusable "docker is only a client here (no daemon answers) and podman is not installed (Debian: apt-get install podman runc)"
    else unusable "neither docker nor podman is installed (Debian: apt-get install podman runc)"; fi
  fi
  case "$ENGINE" in
    docker) ENG=(docker); docker info >/dev/null 2>&1 || unusable "docker: no daemon answers ($(docker info 2>&1 | grep -m1 -i error || true))"
            export DOCKER_BUILDKIT=1 ;;  # --secret and cache mounts need BuildKit
    podman) command -v podman >/dev/null 2>&1 || unusable "podman is not installed (Debian: apt-get install podman runc)"
            podman_flags
            "${ENG[@]}" info >/dev/null 2>&1 || unusable "podman info fails: $("${ENG[@]}" info 2>&1 | tail -1)" ;;
    *) die "--engine takes docker or podman, not $ENGINE" ;;
  esac
}

pick_engine
if [ "$PRINT_ENGINE" = 1 ]; then echo "${ENG[*]}"; echo "${RUN_FLAGS[*]}"; exit 0; fi
say "engine: ${ENG[*]}"

# -- base images: local, pulled, or a stand-in -----------------------------------------------

image_exists() { "${ENG[@]}" image inspect "$1" >/dev/null 2>&1; }
is_stand_in() { [ -n "$("${ENG[@]}" image inspect --format "{{ index .Config.Labels \"$STAND_IN_LABEL\" }}" "$1" 2>/dev/null | grep -v '<no value>')" ]; }

# The FROM image of a Dockerfile's final stage, build arguments' defaults filled in.
dockerfile_base() {  # file [ARG=value overrides]
  local file="$1"; shift
  python3 - "$file" "$@" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)\s*$", text, re.M))
args.update(a.split("=", 1) for a in sys.argv[2:])
base = re.findall(r"^FROM\s+(\S+)", text, re.M)[-1]
print(re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base))
EOF
}

make_stand_in() {  # tag: one Debian bookworm python3 file system, imported once per run
  local tag="$1"
  # One stand-in file system serves every base: reuse the one made before (its own tag).
  if image_exists "$STAND_IN_IMAGE"; then
    say "tagging the stand-in base made before ($STAND_IN_IMAGE) as $tag"
    "${ENG[@]}" tag "$STAND_IN_IMAGE" "$tag" || die "could not tag $STAND_IN_IMAGE as $tag"
    return
  fi
  command -v mmdebstrap >/dev/null 2>&1 ||
    unusable "$tag cannot be pulled and mmdebstrap (for a stand-in base) is not installed (Debian: apt-get install mmdebstrap)"
  say "making a Debian bookworm stand-in for $tag with mmdebstrap from $MIRROR (a few minutes)"
  local t0=$SECONDS
  # merged /usr by mmdebstrap's hook (not the usrmerge package, which pulls in perl); no
  # recommends, no docs; pip may install into the system Python as in the official images (no
  # EXTERNALLY-MANAGED marker). The Python headers are there as in python:3.11-slim.
  mmdebstrap --variant=minbase --format=tar --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
      --include=python3,python3-pip,python3-venv,python-is-python3,libpython3.11-dev,ca-certificates,netbase \
      --aptopt='APT::Install-Recommends "false"' --dpkgopt=force-unsafe-io \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
      bookworm - "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" \
      "deb $SECURITY_MIRROR bookworm-security main" </dev/null |
    "${ENG[@]}" import \
      --change "LABEL $STAND_IN_LABEL=debian-bookworm-python3" \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$STAND_IN_IMAGE" >/dev/null ||
    die "could not make the stand-in base for $tag (mmdebstrap or import failed; see above)"
  "${ENG[@]}" tag "$STAND_IN_IMAGE" "$tag" || die "could not tag $STAND_IN_IMAGE as $tag"
  say "stand-in base $tag made in $((SECONDS - t0)) s"
}

# docker.io for names without a registry (podman may have no unqualified-search registries);
# podman then also gets the short name the Dockerfile's FROM uses.
pull() {
  local image="$1" full="$1" first="${1%%/*}"
  case "$image" in
    */*) case "$first" in *.*|*:*|localhost) ;; *) full="docker.io/$image" ;; esac ;;
    *) full="docker.io/library/$image" ;;
  esac
  timeout 600 "${ENG[@]}" pull "$full" >&2 || return 1
  image_exists "$image" || "${ENG[@]}" tag "$full" "$image"
}

ensure_base() {  # image what: 0 = the real image, 10 = a stand-in (the caller adjusts)
  local image="$1" what="$2"
  if ! image_exists "$image"; then
    say "pulling $image"
    if ! pull "$image"; then
      [ "$STAND_IN" = 1 ] || die "$image cannot be pulled (and --no-stand-in)"
      case "$image" in
        python:3.11-slim|*/python:3.11-slim|pytorch/pytorch:*|*/pytorch/pytorch:*) make_stand_in "$image" ;;
        *) die "$image cannot be pulled and has no stand-in (only python:3.11-slim and pytorch/pytorch:* have one)" ;;
      esac
    fi
  fi
  if is_stand_in "$image"; then
    if [ "$what" = worker ]; then
      banner "STAND-IN BASE: $image is not the PyTorch image: no registry could be reached," \
             "so it is a Debian bookworm file system with python3 3.11 + pip (mmdebstrap), tagged" \
             "with that name. It has NO PyTorch and NO CUDA: the worker image is built WITHOUT the" \
             "[torch] extra (EXTRAS=): the numpy example and the NCCL plugin only."
    else
      banner "STAND-IN BASE: $image is not the official image: no registry could be reached, so" \
             "it is a Debian bookworm file system with python3 3.11 + pip (mmdebstrap), tagged" \
             "with that name. Remove it (${ENG[0]} rmi $image) to pull the real one when you can."
    fi
    return 10
  fi
  return 0
}

# -- the host's pip settings -----------------------------------------------------------------

BUILD_OPTS=()
pip_value() {  # key: PIP_* variable first, then pip's configuration files (last one wins)
  local key="$1" var="PIP_$(echo "$1" | tr 'a-z-' 'A-Z_')"
  if [ -n "${!var:-}" ]; then echo "${!var}"; return; fi
  python3 -m pip config list 2>/dev/null | sed -n "s/^[a-z]*\.$key='\(.*\)'\$/\1/p" | tail -1
}

# A local index or wheel folder: podman mounts it at the same path (a simple index's parent
# too: its links are ../../files/...); docker cannot, so it is left out. Sets KEEP ("" = drop).
local_source() {  # url-or-path
  local src="$1" path="${1#file://}"
  KEEP="$src"
  case "$src" in http://*|https://*) return ;; esac
  KEEP=""
  [ -e "$path" ] || { say "pip source $src does not exist on this host: left out"; return; }
  if [ "${ENG[0]}" = podman ]; then
    local mount="$path"; [ "$(basename "$path")" = simple ] && mount="$(dirname "$path")"
    BUILD_OPTS+=(--volume "$mount:$mount:ro"); KEEP="$src"
  else
    say "pip source $src is local: docker build cannot mount it, left out (the other indexes are used)"
  fi
}

# The build's pip.conf (the secret pip_conf: neither it nor the CA bundle, the secret pip_cert,
# is stored in a layer or in the image's history, so index URLs may carry credentials).
pip_settings() {
  local key value kept item conf="$WORK/pip.conf" cert
  echo "[global]" > "$conf"
  for key in index-url extra-index-url trusted-host find-links; do
    value="$(pip_value "$key")"; [ -n "$value" ] || continue
    kept=""
    if [ "$key" = trusted-host ]; then kept="$value"
    else for item in $value; do local_source "$item"; [ -z "$KEEP" ] || kept="${kept:+$kept }$KEEP"; done; fi
    [ -n "$kept" ] || continue
    echo "$key = $kept" >> "$conf"
    say "pip $key for the build: $kept"
  done
  cert="$(pip_value cert)"
  [ -n "$cert" ] || cert="${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-}}"
  if [ -n "$cert" ] && [ -s "$cert" ]; then
    echo "cert = /run/secrets/pip_cert" >> "$conf"
    BUILD_OPTS+=(--secret "id=pip_cert,src=$cert"); say "pip CA bundle for the build: $cert"
  fi
  BUILD_OPTS+=(--secret "id=pip_conf,src=$conf")
}

# -- build -----------------------------------------------------------------------------------

image_id() { "${ENG[@]}" image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }

build() {  # dockerfile tag [extra build options]
  local file="$1" tag="$2"; shift 2
  local t0=$SECONDS pull=() before after
  [ "${ENG[0]}" = podman ] && pull=(--pull=never)  # ensure_base made sure the base is here
  before="$(image_id "$tag")"
  say "building $tag from $file"
  "${ENG[@]}" build "${pull[@]}" "${RUN_FLAGS[@]}" "${BUILD_OPTS[@]}" "$@" -f "$file" -t "$tag" . ||
    die "building $tag failed (see above)"
  say "built $tag in $((SECONDS - t0)) s"
  after="$(image_id "$tag")"
  # The image this build replaced under the same name: untagged now, unless another name has it.
  if [ -n "$before" ] && [ "$before" != "$after" ] &&
     [ "$("${ENG[@]}" image inspect --format '{{len .RepoTags}}' "$before" 2>/dev/null)" = 0 ]; then
    if "${ENG[@]}" rmi "$before" >/dev/null 2>&1; then say "removed the image $tag replaced (${before#sha256:})"
    else say "the image $tag replaced (${before#sha256:}) is used by a container: left"; fi
  fi
}

# The build stages this engine kept as untagged images (podman; docker without BuildKit).
remove_build_stages() {
  local ids id removed=0
  ids="$("${ENG[@]}" images -q --no-trunc --filter "label=$BUILD_STAGE_LABEL" --filter dangling=true 2>/dev/null |
         sort -u)"
  [ -n "$ids" ] || return 0
  if [ "$KEEP_BUILD_STAGE" = 1 ]; then
    say "kept $(echo "$ids" | wc -l) untagged build-stage image(s) (--keep-build-stage; label $BUILD_STAGE_LABEL)"
    return 0
  fi
  for id in $ids; do  # rmi takes the stage's untagged parent layers with it, never a named image
    if "${ENG[@]}" rmi "$id" >/dev/null 2>&1; then removed=$((removed + 1))
    else say "could not remove the build-stage image ${id#sha256:} (in use?): left"; fi
  done
  say "removed $removed untagged build-stage image(s) (label $BUILD_STAGE_LABEL; --keep-build-stage keeps them)"
}

# Can this engine run a container at all (namespaces, cgroups, rlimits)? Else there is nothing
# to build for: exit 3 with the engine's words.
smoke_run() {
  local out
  out="$("${ENG[@]}" run --rm "${RUN_FLAGS[@]}" --network none --entrypoint true "$1" 2>&1)" ||
    unusable "${ENG[*]} cannot run a container here: $(echo "$out" | tail -2 | tr '\n' ' ')"
}

# The engine's default network (podman: netavark or CNI, which need iptables): when it cannot
# start a container, the builds' RUN steps (apt-get, pip) use the host's network (said so).
NET_PROBED=0
network_probe() {
  local out
  [ "$NET_PROBED" = 0 ] || return 0
  NET_PROBED=1
  out="$("${ENG[@]}" run --rm "${RUN_FLAGS[@]}" --entrypoint true "$1" 2>&1)" && return 0
  say "the default container network does not work here ($(echo "$out" | tail -1)): building with --network host"
  BUILD_OPTS+=(--network host)
}

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
pip_settings
REDUCER_BASE="$(dockerfile_base docker/reducer.Dockerfile)"
if [ -n "$WORKER_BASE" ]; then WORKER_ARGS=(--build-arg "BASE=$WORKER_BASE")
else WORKER_ARGS=(); WORKER_BASE="$(dockerfile_base docker/worker.Dockerfile)"; fi
t_all=$SECONDS
if [ "$ONLY" != worker ]; then
  rc=0; ensure_base "$REDUCER_BASE" reducer || rc=$?; [ $rc = 0 ] || [ $rc = 10 ] || exit $rc
  smoke_run "$REDUCER_BASE"
  network_probe "$REDUCER_BASE"
  build docker/reducer.Dockerfile "reduction-server/reducer:$TAG"
fi
if [ "$ONLY" != reducer ]; then
  rc=0; ensure_base "$WORKER_BASE" worker || rc=$?
  if [ $rc = 10 ]; then WORKER_ARGS+=(--build-arg EXTRAS=); elif [ $rc != 0 ]; then exit $rc; fi
  smoke_run "$WORKER_BASE"
  network_probe "$WORKER_BASE"
  build docker/worker.Dockerfile "reduction-server/worker:$TAG" "${WORKER_ARGS[@]}"
fi
remove_build_stages
say "done in $((SECONDS - t_all)) s"
