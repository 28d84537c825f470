#!/usr/bin/env bash
# Installs the Debian packages GPU Portal needs, when missing and when we can (root + apt).
#   --build   the headers pinned Python packages compile against (python-ldap: libldap, libsasl2); `make setup`
#   (none)    what the integration tests run for real: dockerd, busybox for the test image, chromium, a
#             redis-server to restart, slapd for LDAP, Slurm with munge and slurmdbd, Prometheus
# Without the test packages the affected tests skip with a reason; CI (root on Debian) always gets them.
set -euo pipefail
need=()
if [ "${1:-}" = "--build" ]; then
  [ -f /usr/include/ldap.h ] || need+=(libldap2-dev)
  [ -f /usr/include/sasl/sasl.h ] || need+=(libsasl2-dev)
else
  command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
  [ -x /bin/busybox ] || command -v busybox >/dev/null 2>&1 || need+=(busybox-static)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  # Fault tests restart a redis-server of their own (PostgreSQL comes from the embedded wheel).
  command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
  [ -x /usr/sbin/slapd ] || need+=(slapd)
  command -v ldapadd >/dev/null 2>&1 || need+=(ldap-utils)
  command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || need+=(munge)
  command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || need+=(slurm-wlm)
  command -v slurmdbd >/dev/null 2>&1 || [ -x /usr/sbin/slurmdbd ] || need+=(slurmdbd)
  command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
fi
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "note: missing ${need[*]} (not root or no apt): install them, or the tests that need them are skipped" >&2
  exit 0
fi
echo "installing ${need[*]} (apt)…" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
