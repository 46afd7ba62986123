# Multi-stage build of the two services of the bridge.
#
#   docker build --target agent   -t mxbridge/agent   .
#   docker build --target surface -t mxbridge/surface .
# (compose.yaml does this for you). Needs BuildKit (the default with `docker buildx` /
# Docker Desktop / Docker Engine >= 23) for the cargo cache mounts.
#
# Both runtime images run as the same non-root user `bridge` (10001:10001) with umask 002, and
# carry /workspace owned by that user, so the shared named volume is writable by both.
# For an offline machine, docker/prebuilt.Dockerfile packs host-built binaries into the same
# runtime layout (see compose.local.yaml and scripts/docker-e2e.sh).

ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

# ---------------------------------------------------------------------------------------------
FROM ${RUST_IMAGE} AS builder
# `release` for images people run; the test command builds with `image-check` (the dev profile
# without debug info: the same code, a fraction of the compile time).
ARG CARGO_PROFILE=release
WORKDIR /src
COPY . .
# The registry, git checkouts and the target dir live in cache mounts: a rebuild after a source
# change only recompiles the workspace crates. Binaries are copied out of the cache mount.
RUN --mount=type=cache,id=mxbridge-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=mxbridge-cargo-git,target=/usr/local/cargo/git \
    --mount=type=cache,id=mxbridge-target,target=/src/target \
    cargo build --locked --profile "$CARGO_PROFILE" -p agent -p surface \
 && out="target/$([ "$CARGO_PROFILE" = dev ] && echo debug || echo "$CARGO_PROFILE")" \
 && mkdir -p /out \
 && cp "$out/agent" "$out/surface" /out/ \
 && strip --strip-debug /out/agent /out/surface

# ---------------------------------------------------------------------------------------------
FROM ${RUNTIME_IMAGE} AS runtime
COPY docker/runtime-setup.sh /usr/local/lib/mxbridge/runtime-setup.sh
COPY docker/entrypoint.sh /usr/local/bin/mxbridge-entrypoint
COPY docker/healthcheck.sh /usr/local/bin/mxbridge-healthcheck
RUN sh /usr/local/lib/mxbridge/runtime-setup.sh
ENV WORKSPACE_ROOT=/workspace \
    RUST_LOG=info
USER 10001:10001
WORKDIR /workspace
ENTRYPOINT ["/usr/local/bin/mxbridge-entrypoint"]

# ---------------------------------------------------------------------------------------------
FROM runtime AS agent
COPY --from=builder /out/agent /usr/local/bin/agent
ENV AGENT_BIND=0.0.0.0:8700 \
    AGENT_STATE_DIR=/var/lib/agent
EXPOSE 8700
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["/usr/local/bin/mxbridge-healthcheck", "8700", "/healthz"]
CMD ["agent"]

# ---------------------------------------------------------------------------------------------
FROM runtime AS surface
COPY --from=builder /out/surface /usr/local/bin/surface
ENV SURFACE_HEALTH_BIND=0.0.0.0:8701 \
    SURFACE_STATE_DIR=/var/lib/surface
EXPOSE 8701
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/usr/local/bin/mxbridge-healthcheck", "8701", "/healthz"]
CMD ["surface"]
