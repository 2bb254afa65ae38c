# syntax=docker/dockerfile:1
#
# Compactor: an OpenAI-compatible proxy that compacts long conversations.
#
#   docker build -t compactor .
#   docker run --rm -p 8787:8787 -e COMPACTOR_UPSTREAM=https://api.openai.com/v1 \
#     -v "$PWD/config/compactor.toml:/etc/compactor/compactor.toml:ro" \
#     -v compactor-data:/data compactor
#
# Three stages: cargo-chef plans and builds the dependencies once (a cached layer that only
# changes with Cargo.toml/Cargo.lock), then the proxy itself, then a slim Debian runtime with
# only CA certificates and the binary. TLS is rustls (no libssl at build or run time).

ARG RUST_IMAGE=rust:1-slim-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS chef
# Marks the images of the build stages (this one and the two built on it), so that the images
# earlier builds left behind can be found and removed without touching any other image.
LABEL io.compactor.build-stage="true"
# make builds jemalloc (the proxy's allocator; the slim image has a C compiler but no make).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends make \
    && rm -rf /var/lib/apt/lists/*
RUN cargo install cargo-chef --locked --version 0.1.78
# Set for both the dependency layer and the final build, so cargo reuses what chef cooked.
ENV CARGO_PROFILE_RELEASE_STRIP=symbols
WORKDIR /build

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
COPY --from=planner /build/recipe.json recipe.json
# Build-time settings of dependencies (jemalloc's), so that the cooked layer is the one reused.
COPY .cargo .cargo
RUN cargo chef cook --release --locked --recipe-path recipe.json --bin compactor
COPY . .
RUN cargo build --release --locked --bin compactor

FROM ${RUNTIME_IMAGE} AS runtime
# ca-certificates is left unpinned on purpose: it should follow Debian's security updates.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 compactor \
    && useradd --system --uid 10001 --gid compactor --home-dir /data --no-create-home \
       --shell /usr/sbin/nologin compactor \
    && mkdir -p /data /etc/compactor \
    && chown compactor:compactor /data
COPY --from=builder /build/target/release/compactor /usr/local/bin/compactor
# The default configuration; mount your own from config/ over it (read-only is fine).
COPY config/compactor.toml /etc/compactor/compactor.toml

# Environment overrides the file (COMPACTOR_<KEY>, COMPACTOR_<SECTION>__<KEY>). In a container
# the proxy listens on every interface and keeps its checkpoints in the /data volume.
ENV COMPACTOR_CONFIG=/etc/compactor/compactor.toml \
    COMPACTOR_LISTEN=0.0.0.0:8787 \
    COMPACTOR_STORE=/data/compactor.sqlite3 \
    COMPACTOR_LOG_FORMAT=json

# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8787

# The runtime has no curl: bash's /dev/tcp asks /healthz and checks for a 200 status line.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8787 && printf 'GET /healthz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]

ENTRYPOINT ["compactor", "serve"]
