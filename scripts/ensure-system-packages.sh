#!/usr/bin/env bash
# Installs the Debian packages the integration tests use, when missing and when we can (root + apt).
# Without them the affected tests skip with a reason; CI (root on Debian) always gets them.
set -euo pipefail
need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
[ -x /bin/busybox ] || command -v busybox >/dev/null 2>&1 || need+=(busybox-static)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# Fault tests restart a redis-server of their own (PostgreSQL comes from the embedded wheel).
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "note: missing ${need[*]} (not root or no apt): docker, browser and Redis-restart tests will be skipped" >&2
  exit 0
fi
echo "installing ${need[*]} (apt)…" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
