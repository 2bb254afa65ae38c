#!/bin/sh
# Test-only (see README.md). The compose file mounts its nginx configuration in conf.d, naming
# Docker's embedded DNS (127.0.0.11) as resolver. Podman networks answer names at the address in
# the container's own resolv.conf instead, so a copy with that resolver is what nginx reads.
set -eu
dns=$(awk '$1 == "nameserver" { print $2; exit }' /etc/resolv.conf)
mkdir -p /run/nginx-conf.d
for conf in /etc/nginx/conf.d/*.conf; do
  [ -e "$conf" ] || continue
  sed "s/resolver 127\.0\.0\.11/resolver $dns/" "$conf" > "/run/nginx-conf.d/$(basename "$conf")"
done
exec "$@"
