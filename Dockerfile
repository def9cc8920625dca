# Builds every Herald executable on Debian 12 with Swift 6.3, the way a developer machine does: the build stage
# installs through scripts/setup.sh and nothing else (no apt-get or pip of its own), resolves the committed
# Package.resolved, and builds with `swift build -c release`. scripts/check-deploy.sh checks that this stays so,
# and that the runtime stage installs the runtime library of every -dev package setup.sh installs.
FROM swift:6.3-bookworm AS build
WORKDIR /src
COPY scripts/setup.sh scripts/setup.sh
COPY scripts/patches scripts/patches
RUN bash scripts/setup.sh
COPY Package.swift Package.resolved ./
RUN swift package resolve
COPY . .
RUN swift build -c release && mkdir /out && cp $(swift build -c release --show-bin-path)/herald* /out/

FROM debian:bookworm-slim
# curl: the compose healthchecks; openssl: the compose `keys` step (throwaway stand-in credentials).
RUN apt-get update && apt-get install -y --no-install-recommends libnghttp2-14 libssl3 libcurl4 libjemalloc2 \
      zlib1g libzstd1 liblz4-1 libsasl2-2 tzdata ca-certificates curl openssl && rm -rf /var/lib/apt/lists/*
# librdkafka and hiredis with TLS: built from Debian 13's source by scripts/setup.sh into /usr/local.
COPY --from=build /usr/local/lib/librdkafka.so* /usr/local/lib/libhiredis*.so* /usr/local/lib/
COPY --from=build /usr/lib/swift/linux/*.so /usr/lib/swift/linux/
COPY --from=build /out/ /usr/local/bin/
COPY pipelines /etc/herald/pipelines
RUN ldconfig
ENV HERALD_PIPELINE=/etc/herald/pipelines/example.yaml
# The same unprivileged user as the Kubernetes pods (runAsUser 65532).
USER 65532:65532
