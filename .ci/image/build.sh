#!/usr/bin/env bash
# `make image`: localhost/tierproxy:<package version> and :latest, built with buildah (chroot isolation, vfs
# storage; no Docker daemon, no registry). Run as root.
#   1. base  localhost/tierproxy-base:<recipe hash>: a Debian bookworm minbase root filesystem made by debootstrap
#      from Debian packages, plus python3, a Java 17 runtime and tini (apt inside the image, caches removed).
#      Kept in buildah's storage and rebuilt only when its recipe changes; the debootstrap tarball is cached too.
#   2. wheels: the project and all its runtime dependencies built on this host (pip's cache makes reruns fast).
#   3. .ci/image/Containerfile: a venv from those wheels, copied into a clean base; non-root user; labels.
set -euo pipefail
started=$(date +%s)
repo=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${TIERPROXY_CACHE:-$HOME/.cache/tierproxy}/image
PY=${PY:-python3}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
PACKAGES="python3 python3-venv openjdk-17-jre-headless tini ca-certificates procps"
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
# what goes into the image: an image built from the same files is not built again
source_key=$(cd "$repo" && find tierproxy protocol pyproject.toml README.md .ci/image -type f ! -name '*.pyc' -print0 \
  | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
if [ "$(buildah inspect --type image --format '{{index .ImageAnnotations "tierproxy.source"}}' "$image:$version" \
        2>/dev/null)" = "$source_key" ]; then
  echo "$image:$version is up to date (sources $source_key)"
  exit 0
fi

# --- 1. base ------------------------------------------------------------------------------------------------------
key=$(printf '%s\n' "$SUITE" "$MIRROR" "$SECURITY_MIRROR" "$PACKAGES" "$(sha256sum "$0" | cut -c1-16)" | sha256sum | cut -c1-12)
base=localhost/tierproxy-base:$key
if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  rootfs_tar=$CACHE/rootfs-$SUITE-minbase.tar
  if [ ! -f "$rootfs_tar" ]; then
    echo "debootstrap $SUITE (minbase) from $MIRROR"
    tmp=$(mktemp -d)
    debootstrap --variant=minbase "$SUITE" "$tmp/rootfs" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap.log"; exit 1; }
    tar -C "$tmp/rootfs" --numeric-owner -cf "$rootfs_tar.part" .
    mv "$rootfs_tar.part" "$rootfs_tar"
    rm -rf "$tmp"
  fi
  echo "base image $base: $PACKAGES"
  ctr=$(buildah from scratch)
  trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
  buildah add "$ctr" "$rootfs_tar" / >/dev/null
  buildah run --network host "$ctr" -- sh -ec "
    printf 'deb $MIRROR $SUITE main\ndeb $MIRROR $SUITE-updates main\ndeb $SECURITY_MIRROR $SUITE-security main\n' > /etc/apt/sources.list
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PACKAGES >/dev/null
    apt-get clean
    rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/* /usr/share/doc/* /usr/share/man/* /usr/share/locale/* \
           /tmp/* /var/tmp/*"
  buildah config --env LANG=C.UTF-8 "$ctr"
  buildah commit --quiet --rm "$ctr" "$base" >/dev/null
  trap - EXIT
fi

# --- 2. wheels ----------------------------------------------------------------------------------------------------
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/wheels"
echo "wheels for tierproxy $version and its dependencies"
"$PY" -m pip wheel -q --wheel-dir "$ctx/wheels" "$repo[all]"  # every extra (the jobs), uvloop: the default event loop where installed
cp "$repo/.ci/image/Containerfile" "$ctx/Containerfile"

# --- 3. image -----------------------------------------------------------------------------------------------------
echo "building $image:$version"
buildah bud --quiet --isolation chroot --network host --annotation "tierproxy.source=$source_key" \
  --build-arg "BASE=$base" --build-arg "VERSION=$version" \
  --build-arg "REVISION=$revision" --build-arg "SOURCE=${TIERPROXY_SOURCE:-https://github.com/tierproxy/tierproxy}" \
  -f "$ctx/Containerfile" -t "$image:$version" -t "$image:latest" "$ctx" >/dev/null
buildah rmi --prune >/dev/null 2>&1 || true  # the build stage
echo "built $image:$version and $image:latest in $(( $(date +%s) - started )) s"
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$image:$version"
