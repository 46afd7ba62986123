# Runtime images from binaries built on the host (Debian bookworm, so glibc matches the
# debian:bookworm-slim runtime). Used by compose.local.yaml on machines that cannot run the Rust
# builder stage of ../Dockerfile (no registry to pull rust:* from). Same layout as the runtime
# stages there: keep the two in sync (both run docker/runtime-setup.sh).
#
# Build context: a staging directory made by scripts/docker-e2e.sh holding
#   bin/agent bin/surface runtime-setup.sh entrypoint.sh healthcheck.sh prebuilt.Dockerfile
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUNTIME_IMAGE} AS runtime
COPY runtime-setup.sh /usr/local/lib/mxbridge/runtime-setup.sh
COPY entrypoint.sh /usr/local/bin/mxbridge-entrypoint
COPY healthcheck.sh /usr/local/bin/mxbridge-healthcheck
RUN sh /usr/local/lib/mxbridge/runtime-setup.sh \
 && chmod 0755 /usr/local/bin/mxbridge-entrypoint /usr/local/bin/mxbridge-healthcheck
ENV WORKSPACE_ROOT=/workspace \
    RUST_LOG=info
USER 10001:10001
WORKDIR /workspace
ENTRYPOINT ["/usr/local/bin/mxbridge-entrypoint"]

FROM runtime AS agent
COPY bin/agent /usr/local/bin/agent
ENV AGENT_BIND=0.0.0.0:8700 \
    AGENT_STATE_DIR=/var/lib/agent
EXPOSE 8700
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["/usr/local/bin/mxbridge-healthcheck", "8700", "/healthz"]
CMD ["agent"]

FROM runtime AS surface
COPY bin/surface /usr/local/bin/surface
ENV SURFACE_HEALTH_BIND=0.0.0.0:8701 \
    SURFACE_STATE_DIR=/var/lib/surface
EXPOSE 8701
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/usr/local/bin/mxbridge-healthcheck", "8701", "/healthz"]
CMD ["surface"]
