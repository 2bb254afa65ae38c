# Test-only stand-in for rust:1-slim-bookworm (see README.md): Debian bookworm with gcc and the
# host's own Rust toolchain, mounted at build time as /host-toolchain, plus the host's extra CA
# certificates (mounted as /host-ca), which cargo needs where HTTPS is re-signed by a local CA.
ARG BASE
FROM ${BASE}
# Changes when the host's toolchain does, so a cached layer never keeps an old one.
ARG TOOLCHAIN_VERSION
ENV RUSTUP_HOME=/usr/local/rustup \
    CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && (cp /host-ca/*.crt /usr/local/share/ca-certificates/ 2>/dev/null || true) \
    && update-ca-certificates \
    && mkdir -p /usr/local/rust /usr/local/cargo/bin \
    && cp -a /host-toolchain/bin /host-toolchain/lib /host-toolchain/libexec /usr/local/rust/ \
    && echo "toolchain ${TOOLCHAIN_VERSION}" \
    && rustc --version && cargo --version
