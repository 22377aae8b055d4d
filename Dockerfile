# syntax=docker/dockerfile:1
# Multi-stage build: compile in the Rust image, run on a slim Debian with CA certificates and
# ISA-L (the gzip of Storage Write requests).
FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libisal-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY migrations ./migrations
RUN cargo build --release --locked && strip target/release/filament-bigquery

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libisal2 && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home filament
COPY --from=build /src/target/release/filament-bigquery /usr/local/bin/filament-bigquery
USER filament
ENV FILAMENT_LISTEN=0.0.0.0:8080 FILAMENT_LOG_FORMAT=json
EXPOSE 8080
ENTRYPOINT ["filament-bigquery"]
CMD ["serve"]
