# lock-janitor container image: the static (musl) binary alone, no shell, for
# linux/amd64 and linux/arm64.
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     -t ghcr.io/lock-janitor/lock-janitor:0.1.0 .
#
# This is the image `make release` assembles without Docker (dist/image, an
# OCI layout; see docs/install.md): the same cargo-zigbuild command builds the
# binary, the same config (user 65532, entrypoint `/lock-janitor run`, OCI
# labels) wraps it. The builder runs on the build machine's platform and
# cross-compiles for TARGETARCH, so no emulation is needed. Needs BuildKit
# (the default builder since Docker 23) for the cache mounts.
# hack/docker-build-check.sh lints this file and runs the same cargo command
# outside Docker; keep the ARG pins equal to hack/release-versions.env.

FROM --platform=$BUILDPLATFORM rust:1.95-bookworm AS builder

ARG ZIGLANG_VERSION=0.17.0
ARG CARGO_ZIGBUILD_VERSION=0.24.0
ARG TARGETARCH

# zig (ziglang) is the C compiler and linker for the musl targets: ring
# compiles C and assembly, and zig links it statically for either arch.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/zig \
 && /opt/zig/bin/pip install --no-cache-dir "ziglang==${ZIGLANG_VERSION}" "cargo-zigbuild==${CARGO_ZIGBUILD_VERSION}" \
 && rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl
ENV PATH=/opt/zig/bin:$PATH

WORKDIR /src
COPY . .

# The cache mounts keep the registry and target/ between builds; the binary is
# copied out of the mounted target/ in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    case "${TARGETARCH}" in \
      amd64) triple=x86_64-unknown-linux-musl ;; \
      arm64) triple=aarch64-unknown-linux-musl ;; \
      *) echo "unsupported TARGETARCH '${TARGETARCH}' (amd64 or arm64)" >&2; exit 1 ;; \
    esac \
 && cargo zigbuild --release --locked --target "$triple" \
 && cp "target/$triple/release/lock-janitor" /lock-janitor

FROM scratch

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="lock-janitor" \
      org.opencontainers.image.description="Frees leader-election locks (operator-lib ConfigMaps and Leases) whose holder pod can no longer run, so a waiting replica takes over." \
      org.opencontainers.image.source="https://github.com/lock-janitor/lock-janitor" \
      org.opencontainers.image.url="https://github.com/lock-janitor/lock-janitor" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=builder /lock-janitor /lock-janitor
USER 65532:65532
# /metrics, /healthz, /readyz
EXPOSE 8080
ENTRYPOINT ["/lock-janitor", "run"]
