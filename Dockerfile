# Builds every Herald executable on Debian 12 with Swift 6 (librdkafka >= 2.2 from scripts/setup.sh).
FROM swift:6.1-bookworm AS build
WORKDIR /src
COPY scripts/setup.sh scripts/setup.sh
RUN apt-get update && apt-get install -y --no-install-recommends python3-venv ca-certificates \
    && bash scripts/setup.sh
COPY . .
RUN swift build -c release && mkdir /out && cp $(swift build -c release --show-bin-path)/herald* /out/

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends libhiredis0.14 libnghttp2-14 libssl3 \
      zlib1g libzstd1 liblz4-1 libsasl2-2 tzdata ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/lib/librdkafka.so* /usr/local/lib/
COPY --from=build /usr/lib/swift/linux/*.so /usr/lib/swift/linux/
COPY --from=build /out/ /usr/local/bin/
COPY pipelines /etc/herald/pipelines
RUN ldconfig
ENV HERALD_PIPELINE=/etc/herald/pipelines/example.yaml
