#!/usr/bin/env bash
# `make image`: two images, each :<package version> and :latest, built with buildah (chroot isolation, vfs
# storage; no Docker daemon, no registry). Run as root.
#   localhost/tierproxy       `serve`, `admin`, `restore`: `pip install 'kafka-tierproxy[uvloop]'`, no JRE, no Spark
#   localhost/tierproxy-jobs  `tier`, `iceberg` (PySpark jobs) and the rest: `kafka-tierproxy[all]` and a Java 17 runtime
#   1. bases localhost/tierproxy-base-<proxy|jobs>:<recipe hash>: a Debian bookworm minbase root filesystem made by
#      debootstrap from Debian packages, plus python3 and tini (and the JRE for jobs; apt inside the image, caches
#      removed). Kept in buildah's storage and rebuilt only when the recipe changes; the debootstrap tarball is
#      cached too.
#   2. wheels: the project and all its runtime dependencies built on this host (pip's cache makes reruns fast).
#   3. .ci/image/Containerfile: a venv from those wheels, copied into a clean base; non-root user; labels.
set -euo pipefail
started=$(date +%s)
at() { echo "[$(( $(date +%s) - started )) s]"; }  # each step's start in the log: what the build's time went to
repo=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${TIERPROXY_CACHE:-$HOME/.cache/tierproxy}/image
PY=${PY:-python3}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
PROXY_PACKAGES="python3 python3-venv tini ca-certificates"
JOBS_PACKAGES="$PROXY_PACKAGES openjdk-17-jre-headless procps"
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs} BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}
mkdir -p "$CACHE"
# one build at a time (make test starts one in the background; the image tests wait for it here)
exec 9>"$CACHE/.build.lock"
flock 9

if ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then
  echo "installing buildah and debootstrap (Debian packages)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah debootstrap >/dev/null
fi

version=$(cd "$repo" && "$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
image=localhost/tierproxy
jobs_image=localhost/tierproxy-jobs
# what goes into the image: an image built from the same files is not built again
# (not __pycache__: the suite writes bytecode and numba's kernel caches there while the image builds, and a key
# that moved with them built both images twice)
source_key=$(cd "$repo" && find tierproxy protocol pyproject.toml README.md .ci/image -name __pycache__ -prune -o -type f \
  -print0 \
  | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
annotation() { buildah inspect --type image --format '{{index .ImageAnnotations "tierproxy.source"}}' "$1" 2>/dev/null; }
if [ "$(annotation "$image:$version")" = "$source_key" ] && [ "$(annotation "$jobs_image:$version")" = "$source_key" ]; then
  echo "$image:$version and $jobs_image:$version are up to date (sources $source_key)"
  exit 0
fi

# --- 1. bases -----------------------------------------------------------------------------------------------------
rootfs_tar=$CACHE/rootfs-$SUITE-minbase.tar
base_image() {  # NAME PACKAGES → prints the base image's name, building it when its recipe is new
  local name=$1 packages=$2 key base ctr
  key=$(printf '%s\n' "$SUITE" "$MIRROR" "$SECURITY_MIRROR" "$packages" "$(sha256sum "$0" | cut -c1-16)" | sha256sum | cut -c1-12)
  base=localhost/tierproxy-base-$name:$key
  if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
    if [ ! -f "$rootfs_tar" ]; then
      echo "$(at) debootstrap $SUITE (minbase) from $MIRROR" >&2
      tmp=$(mktemp -d)
      debootstrap --variant=minbase "$SUITE" "$tmp/rootfs" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
        || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
      tar -C "$tmp/rootfs" --numeric-owner -cf "$rootfs_tar.part" .
      mv "$rootfs_tar.part" "$rootfs_tar"
      rm -rf "$tmp"
    fi
    echo "$(at) base image $base: $packages" >&2
    ctr=$(buildah from scratch)
    trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
    buildah add "$ctr" "$rootfs_tar" / >/dev/null
    buildah run --network host "$ctr" -- sh -ec "
      printf 'deb $MIRROR $SUITE main\ndeb $MIRROR $SUITE-updates main\ndeb $SECURITY_MIRROR $SUITE-security main\n' > /etc/apt/sources.list
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages >/dev/null
      apt-get clean
      rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/* /usr/share/doc/* /usr/share/man/* /usr/share/locale/* \
             /tmp/* /var/tmp/*" >&2
    buildah config --env LANG=C.UTF-8 "$ctr"
    buildah commit --quiet --rm "$ctr" "$base" >/dev/null
    trap - EXIT
  fi
  echo "$base"
}
proxy_base=$(base_image proxy "$PROXY_PACKAGES")
jobs_base=$(base_image jobs "$JOBS_PACKAGES")

# --- 2. wheels ----------------------------------------------------------------------------------------------------
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/wheels"
echo "$(at) wheels for tierproxy $version and its dependencies"
"$PY" -m pip wheel -q --wheel-dir "$ctx/wheels" "$repo[all]"  # every extra (the jobs), uvloop: the default event loop where installed
cp "$repo/.ci/image/Containerfile" "$ctx/Containerfile"

# --- 3. images ----------------------------------------------------------------------------------------------------
build() {  # IMAGE BASE EXTRAS TITLE DESCRIPTION JAVA_HOME
  echo "$(at) building $1:$version"
  buildah bud --quiet --isolation chroot --network host --annotation "tierproxy.source=$source_key" \
    --build-arg "BASE=$2" --build-arg "EXTRAS=$3" --build-arg "TITLE=$4" --build-arg "DESCRIPTION=$5" \
    --build-arg "JAVA_HOME=$6" --build-arg "VERSION=$version" \
    --build-arg "REVISION=$revision" --build-arg "SOURCE=${TIERPROXY_SOURCE:-https://github.com/tierproxy/tierproxy}" \
    -f "$ctx/Containerfile" -t "$1:$version" -t "$1:latest" "$ctx" >/dev/null
}
build "$image" "$proxy_base" uvloop tierproxy \
  "Kafka wire-protocol proxy with a remote tier on object storage (KIP-405 from the outside): serve, admin, restore" ""
build "$jobs_image" "$jobs_base" all tierproxy-jobs \
  "tierproxy's PySpark jobs (tier, iceberg) with a Java 17 runtime, and every other command" \
  /usr/lib/jvm/java-17-openjdk-amd64
buildah rmi --prune >/dev/null 2>&1 || true  # the build stages
echo "built $image:$version and $jobs_image:$version (and :latest) in $(( $(date +%s) - started )) s"
for i in "$image:$version" "$jobs_image:$version"; do buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$i"; done
