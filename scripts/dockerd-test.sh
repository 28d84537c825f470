#!/usr/bin/env bash
# A throwaway Docker engine for the runtime tests, started by hand as DESIGN.md describes (no systemd, no
# iptables, no bridge: containers use network "none"), plus the local test image portal-test/busybox:latest
# (there is no registry to pull from).
#
#   scripts/dockerd-test.sh start [DIR]   start dockerd under DIR (default /tmp/portal-dockerd), build the image,
#                                         print the line to export for pytest
#   scripts/dockerd-test.sh stop  [DIR]   remove its containers, stop it, delete DIR
#
# The pytest fixture (tests/support/dockerd.py) does the same by itself; this is for humans and CI jobs that
# want one engine across several pytest runs: export PORTAL_TEST_DOCKER_HOST=unix://DIR/docker.sock.
# Needs root, Debian's docker.io (dockerd + docker CLI) and busybox-static.
set -euo pipefail

cmd=${1:-start}
dir=${2:-/tmp/portal-dockerd}
sock="$dir/docker.sock"
image=portal-test/busybox:latest

docker_cli() { docker -H "unix://$sock" "$@"; }

launch() {  # $1 = storage driver
    dockerd --config-file "$dir/daemon.json" --data-root "$dir/data-$1" --exec-root "$dir/exec" \
        -H "unix://$sock" --pidfile "$dir/dockerd.pid" --storage-driver "$1" \
        --iptables=false --ip6tables=false --ip-masq=false --bridge=none >>"$dir/dockerd.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 300); do
        if docker_cli version >/dev/null 2>&1; then return 0; fi
        if ! kill -0 "$pid" 2>/dev/null; then return 1; fi
        sleep 0.1
    done
    kill "$pid" 2>/dev/null || true
    return 1
}

build_image() {
    if docker_cli image inspect "$image" >/dev/null 2>&1; then return 0; fi
    local busybox rootfs
    busybox=$(command -v busybox)
    rootfs=$(mktemp -d)
    mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/tmp"
    chmod 1777 "$rootfs/tmp"
    cp "$busybox" "$rootfs/bin/busybox"
    for applet in $("$busybox" --list); do
        [ "$applet" = busybox ] || ln -s busybox "$rootfs/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\n' >"$rootfs/etc/passwd"
    tar -C "$rootfs" -cf - . | docker_cli import -c 'ENV PATH=/bin' - "$image" >/dev/null
    rm -rf "$rootfs"
}

case "$cmd" in
start)
    [ "$(id -u)" = 0 ] || { echo "dockerd needs root" >&2; exit 1; }
    mkdir -p "$dir"
    echo '{}' >"$dir/daemon.json"  # the host's /etc/docker/daemon.json must not apply
    if ! docker_cli version >/dev/null 2>&1; then
        launch overlay2 || launch vfs || { tail -20 "$dir/dockerd.log" >&2; exit 1; }
    fi
    build_image
    echo "export PORTAL_TEST_DOCKER_HOST=unix://$sock"
    ;;
stop)
    if docker_cli version >/dev/null 2>&1; then
        ids=$(docker_cli ps -aq)
        [ -z "$ids" ] || docker_cli rm -f $ids >/dev/null
    fi
    if [ -f "$dir/dockerd.pid" ]; then
        pid=$(cat "$dir/dockerd.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    # Mounts left by a hard death would keep rm from deleting the data root.
    grep -o " $dir/[^ ]*" /proc/self/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    rm -rf "$dir"
    ;;
*)
    echo "usage: $0 start|stop [DIR]" >&2
    exit 2
    ;;
esac
