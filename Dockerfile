# lock-janitor container image: a static musl binary on distroless.
#
#   docker build -t ghcr.io/lock-janitor/lock-janitor:0.1.0 .
#
# Needs BuildKit (the default builder since Docker 23) for the cache mounts.
# hack/docker-build-check.sh lints this file and runs the same cargo command
# outside Docker.

FROM rust:1.95-bookworm AS builder

# ring compiles C and assembly for the target: it needs musl-gcc.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl

WORKDIR /src
COPY . .

# The cache mounts keep the registry and target/ between builds; the binary is
# copied out of the mounted target/ in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --target x86_64-unknown-linux-musl \
 && cp target/x86_64-unknown-linux-musl/release/lock-janitor /lock-janitor

FROM gcr.io/distroless/static-debian12:nonroot

LABEL org.opencontainers.image.title="lock-janitor" \
      org.opencontainers.image.description="Deletes leader-for-life locks whose holder pod can no longer run, so a waiting replica takes over." \
      org.opencontainers.image.source="https://github.com/lock-janitor/lock-janitor" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=builder /lock-janitor /lock-janitor
USER 65532:65532
# /metrics, /healthz, /readyz
EXPOSE 8080
ENTRYPOINT ["/lock-janitor", "run"]
