# Test-only stand-in for redis:7-alpine (see README.md): Debian's redis-server. Debian's build
# starts in protected mode, which refuses the other containers; the official image does not.
ARG BASE
FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server redis-tools \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data && chown redis:redis /data \
    && printf '#!/bin/sh\nif [ "$1" = redis-server ]; then set -- "$@" --protected-mode no; fi\nexec "$@"\n' \
       > /usr/local/bin/redis-entrypoint && chmod 755 /usr/local/bin/redis-entrypoint
USER redis
WORKDIR /data
EXPOSE 6379
ENTRYPOINT ["/usr/local/bin/redis-entrypoint"]
CMD ["redis-server"]
