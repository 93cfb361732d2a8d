# The argocd-agent-rs image: `argocd-agent` (principal, agent) and `argocd-agentctl`.
#
# Built like upstream's image, so that upstream's manifests and chart work with it unchanged:
# the binary is /bin/argocd-agent and is the entrypoint (Deployments pass only `args:
# [principal]` or `[agent]`), and it runs as user 999. Read-only root filesystem friendly: the
# processes write nothing to disk (no cache, no temp files), so the charts set
# readOnlyRootFilesystem and mount nothing writable.
#
#   docker build -t argocd-agent-rs:0.1.0 .      (or: buildah bud, podman build)
#
# The image names below have no registry host: your builder resolves them through its own
# configuration (a mirror, or its default registry).

# --- build ---
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# Protobuf is compiled in Rust (protox): no protoc. ring needs a C compiler, which the rust
# image has.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    CARGO_PROFILE_RELEASE_STRIP=symbols cargo build --release --locked -p cli --bin argocd-agent --bin argocd-agentctl \
 && mkdir -p /out \
 && cp target/release/argocd-agent target/release/argocd-agentctl /out/

# --- run ---
FROM debian:bookworm-slim
# Only the binaries and the CA bundle (the Kubernetes client can be pointed at API servers with
# public certificates); glibc and libgcc come with the base image.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/argocd-agent /out/argocd-agentctl /bin/
# 999 as upstream's image (and the charts' securityContext): not root, no home directory needed.
USER 999:999
# gRPC, principal metrics and health, agent metrics and health (the defaults; the charts set
# them explicitly).
EXPOSE 8443 8000 8003 8181 8002
ENTRYPOINT ["/bin/argocd-agent"]
