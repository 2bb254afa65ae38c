# Test-only stand-in for nginx:1.28-alpine (see README.md): Debian forky's nginx, the first with
# `server ... resolve` in open-source nginx. The mirror's testing Release may be past its
# Valid-Until against the clock, which does not matter for a throwaway test image.
ARG BASE
FROM ${BASE}
RUN apt-get -o Acquire::Check-Valid-Until=false update \
    && apt-get install -y --no-install-recommends nginx \
    && rm -rf /var/lib/apt/lists/* /etc/nginx/sites-enabled/* \
    && sed -i 's|include /etc/nginx/conf.d/\*.conf;|include /run/nginx-conf.d/*.conf;|' /etc/nginx/nginx.conf \
    && grep -q /run/nginx-conf.d /etc/nginx/nginx.conf \
    && ln -sf /dev/stdout /var/log/nginx/access.log && ln -sf /dev/stderr /var/log/nginx/error.log
COPY nginx-entrypoint.sh /usr/local/bin/nginx-entrypoint
EXPOSE 80
ENTRYPOINT ["/usr/local/bin/nginx-entrypoint"]
CMD ["nginx", "-g", "daemon off;"]
