// swift-tools-version:6.1
// Herald: a push-notification back end for chat services. Linux only (Glibc, epoll; Debian 12 is the reference).
//
// Layout on disk follows the layers (each imports only what is listed below it; docs/architecture.md says more):
//   Sources/Tools      heraldctl, herald-bench, herald-chaos (the fault suite), herald-kafka-bench, herald-apns-bench,
//                      herald-dev-broker (the local and test Kafka broker), HeraldBenchSupport (the local stack under load, which herald-bench and herald-chaos share),
//                      and HeraldToolSupport (the HTTP probe, Prometheus text reader and JSON reports every tool shares)
//   Sources/Stages     the six stage executables (herald-ingest, -resolve, -suppress, -render, -send, -registry)
//   Sources/Runtime    HeraldStage: what every stage process shares (stage loop, /metrics and health endpoint,
//                      lifecycle, logs, configuration binding); HeraldRegistryAPI: the registry API's routes and
//                      the registry operations heraldctl shares; HeraldSend: send's transports over the provider
//                      clients; HeraldTracing: W3C trace context, sampling, spans and their OTLP/HTTP exporter
//   Sources/Pipeline   HeraldPipeline: what each stage does to a batch, pure over ports (it opens no socket); it sits
//                      beside the adapters: HeraldPipeline and the adapters do not import each other
//   Sources/Adapters   HeraldKafka, HeraldRedis, HeraldPushProviders (nghttp2 HTTP/2: APNs, FCM, Web Push), HeraldHTTP (libcurl
//                      HTTP/1.1: OAuth, webhooks), HeraldTLS (the OpenSSL client context Redis and APNs/FCM share)
//   Sources/Core       HeraldConfig (pipeline YAML -> typed configuration) over HeraldCore (pure: events, state,
//                      rules, rendering, payloads, answer tables, record codecs)
//   Sources/CShims     C modules: CRdKafka, CHiredis, CNghttp2, COpenSSL (system libraries), CHeraldCurl and
//                      CHeraldMockTLS (small C wrappers for variadic or macro-only APIs), CHeraldRESP (hiredis's
//                      replies read into one flat, reused buffer), CHeraldPortPlan (herald-dev-broker's bind(2))
//   Sources/StandIns   herald-mock-apns and herald-mock-fcm with their libraries HeraldMockAPNs and
//                      HeraldMockProviders; on purpose they import none of Herald's modules, so they check requests
//                      independently of the code under test. herald-mock-otlp (the OTLP trace receiver) reads
//                      spans with HeraldToolSupport's OTLP reader, which shares no code with the stages' OTLP writer.
// Tests: one test target per module plus EndToEndTests; Tests/HeraldTestSupport is a regular target with what the
// test targets share (ports, processes, Tansu, redis-server, TLS material, waits on conditions).
import PackageDescription

let package = Package(
    name: "Herald",
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/jpsim/Yams.git", from: "6.2.2"),
        .package(url: "https://github.com/x-sheep/swift-property-based.git", from: "2.0.1"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift.git", from: "0.2.0"),
        .package(url: "https://github.com/apple/swift-collections.git", from: "1.6.0"),
    ],
    targets: [
        // MARK: Pure core
        .target(name: "HeraldCore", path: "Sources/Core/HeraldCore"),
        .target(
            name: "HeraldConfig",
            dependencies: [
                "HeraldCore",
                .product(name: "Yams", package: "Yams"),
            ], path: "Sources/Core/HeraldConfig"),

        // MARK: C libraries (system-library targets: modulemap + shim.h + pkg-config)
        .systemLibrary(
            name: "CRdKafka", path: "Sources/CShims/CRdKafka", pkgConfig: "rdkafka",
            providers: [.apt(["librdkafka-dev"])]),
        // hiredis 1.x with TLS (hiredis_ssl.pc requires hiredis.pc): Debian 12 ships 0.14 without TLS, so
        // scripts/setup.sh builds Debian 13's source into /usr/local.
        .systemLibrary(name: "CHiredis", path: "Sources/CShims/CHiredis", pkgConfig: "hiredis_ssl"),
        .systemLibrary(
            name: "CNghttp2", path: "Sources/CShims/CNghttp2", pkgConfig: "libnghttp2",
            providers: [.apt(["libnghttp2-dev"])]),
        .systemLibrary(
            name: "COpenSSL", path: "Sources/CShims/COpenSSL", pkgConfig: "openssl", providers: [.apt(["libssl-dev"])]),

        // Typed wrappers over libcurl's variadic setters (HTTP/1.1 work: FCM OAuth, webhooks).
        .target(name: "CHeraldCurl", path: "Sources/CShims/CHeraldCurl", linkerSettings: [.linkedLibrary("curl")]),
        // A reply builder for hiredis's reader that keeps replies flat (one node array, one byte buffer) and reused.
        .target(name: "CHeraldRESP", dependencies: ["CHiredis"], path: "Sources/CShims/CHeraldRESP"),

        // MARK: Adapters
        // The OpenSSL client context every TLS client shares (Redis, APNs, FCM): TLS 1.2+, trust, host-name checks.
        .target(name: "HeraldTLS", dependencies: ["COpenSSL"], path: "Sources/Adapters/HeraldTLS"),
        .target(name: "HeraldHTTP", dependencies: ["CHeraldCurl", "HeraldCore"], path: "Sources/Adapters/HeraldHTTP"),
        .target(
            name: "HeraldKafka",
            dependencies: [
                "CRdKafka", "HeraldCore",
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ], path: "Sources/Adapters/HeraldKafka"),
        .target(
            name: "HeraldRedis",
            dependencies: [
                "CHeraldRESP", "CHiredis", "COpenSSL", "HeraldCore", "HeraldTLS",
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "Logging", package: "swift-log"),
            ], path: "Sources/Adapters/HeraldRedis"),
        .target(
            name: "HeraldPushProviders",
            dependencies: [
                "CNghttp2", "COpenSSL", "HeraldCore", "HeraldHTTP", "HeraldTLS",
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ], path: "Sources/Adapters/HeraldPushProviders"),

        // MARK: Per-stage processing (pure over ports: unit-testable without Kafka, Redis or APNs)
        .target(
            name: "HeraldPipeline", dependencies: ["HeraldCore"],
            path: "Sources/Pipeline/HeraldPipeline"),

        // MARK: What every stage executable shares
        .target(
            name: "HeraldStage",
            dependencies: [
                "HeraldCore", "HeraldConfig", "HeraldKafka", "HeraldRedis", "HeraldHTTP", "HeraldPipeline",
                "HeraldTracing",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ], path: "Sources/Runtime/HeraldStage"),

        // Tracing: W3C trace context, sampling, the tracing settings (pipeline file + OTEL_* environment), the spans
        // and their OTLP/HTTP exporter (protobuf written by hand, sent with HeraldHTTP). HeraldCore and the other
        // adapters never import it: Kafka carries trace contexts as header bytes.
        .target(
            name: "HeraldTracing",
            dependencies: [
                "HeraldConfig", "HeraldHTTP",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ], path: "Sources/Runtime/HeraldTracing"),

        // The registry operations (the HTTP API's routes and what heraldctl shares with them), over Redis and Kafka;
        // transport-free: herald-registry serves it through HeraldStage's HTTP endpoint.
        .target(
            name: "HeraldRegistryAPI",
            dependencies: [
                "HeraldCore", "HeraldKafka", "HeraldRedis", "HeraldTracing",
                .product(name: "Logging", package: "swift-log"),
            ], path: "Sources/Runtime/HeraldRegistryAPI"),

        // send's transports over the provider clients: routing by provider, a client per credential kept across
        // reloads, and the readiness rule of herald-send's /readyz.
        .target(
            name: "HeraldSend",
            dependencies: [
                "HeraldCore", "HeraldPipeline", "HeraldPushProviders", "HeraldHTTP",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ], path: "Sources/Runtime/HeraldSend"),

        // MARK: Executables
        // The six pipeline stages: a page each (configuration, adapters, run).
        .executableTarget(
            name: "herald-ingest", dependencies: ["HeraldStage", "HeraldPipeline", "HeraldConfig"],
            path: "Sources/Stages/herald-ingest"),
        .executableTarget(
            name: "herald-resolve",
            dependencies: ["HeraldStage", "HeraldPipeline", "HeraldConfig", "HeraldCore", "HeraldRedis"],
            path: "Sources/Stages/herald-resolve"),
        // Suppress, render and send link jemalloc instead of glibc's malloc: each frees on Swift's threads much of
        // what another thread allocated (the consumer's records; in send also its provider clients' answers and
        // completions), which glibc serves through locked arenas. Side by side it took suppress to about 0.93 of its
        // CPU, render to 0.96 and send to 0.83-0.91; ingest and resolve showed nothing. docs/performance.md.
        .executableTarget(
            name: "herald-suppress", dependencies: ["HeraldStage", "HeraldPipeline", "HeraldConfig", "HeraldCore"],
            path: "Sources/Stages/herald-suppress", linkerSettings: [.linkedLibrary("jemalloc")]),
        .executableTarget(
            name: "herald-render", dependencies: ["HeraldStage", "HeraldPipeline", "HeraldConfig", "HeraldCore"],
            path: "Sources/Stages/herald-render", linkerSettings: [.linkedLibrary("jemalloc")]),
        .executableTarget(
            name: "herald-send",
            dependencies: [
                "HeraldStage", "HeraldPipeline", "HeraldConfig", "HeraldCore", "HeraldRedis", "HeraldSend",
            ], path: "Sources/Stages/herald-send", linkerSettings: [.linkedLibrary("jemalloc")]),
        .executableTarget(
            name: "herald-registry",
            dependencies: [
                "HeraldStage", "HeraldPipeline", "HeraldConfig", "HeraldCore", "HeraldRedis", "HeraldRegistryAPI",
                .product(name: "Metrics", package: "swift-metrics"),
            ], path: "Sources/Stages/herald-registry"),
        .executableTarget(
            name: "heraldctl",
            dependencies: [
                "HeraldCore", "HeraldConfig", "HeraldPushProviders", "HeraldHTTP", "HeraldKafka", "HeraldRedis",
                "HeraldRegistryAPI", "HeraldToolSupport",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ], path: "Sources/Tools/heraldctl"),
        .executableTarget(
            name: "herald-mock-apns",
            dependencies: [
                "HeraldMockAPNs",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ], path: "Sources/StandIns/herald-mock-apns"),
        // The APNs stand-in as a library (checks, faults, recording, HTTP/2 server) so it is testable.
        .target(
            name: "HeraldMockAPNs",
            dependencies: [
                "HeraldCore", "CNghttp2", "CHeraldMockTLS", .product(name: "DequeModule", package: "swift-collections"),
            ], path: "Sources/StandIns/HeraldMockAPNs"),
        // OpenSSL server setup and ES256 verification for the stand-in (OpenSSL macros are not importable).
        .target(
            name: "CHeraldMockTLS", path: "Sources/CShims/CHeraldMockTLS",
            linkerSettings: [.linkedLibrary("ssl"), .linkedLibrary("crypto")]),
        // The FCM (token endpoint + messages:send over HTTP/2) and custom-webhook stand-in, as a library.
        .target(
            name: "HeraldMockProviders", dependencies: ["CNghttp2", "COpenSSL"],
            path: "Sources/StandIns/HeraldMockProviders"),
        .executableTarget(
            name: "herald-mock-fcm",
            dependencies: [
                "HeraldMockProviders",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ], path: "Sources/StandIns/herald-mock-fcm"),
        // The OTLP/HTTP trace receiver stand-in (the local stack's, `heraldctl trace` reads it). It imports only
        // HeraldToolSupport's OTLP reader, written from the OTLP definitions apart from the stages' exporter.
        .executableTarget(
            name: "herald-mock-otlp",
            dependencies: [
                "HeraldToolSupport",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ], path: "Sources/StandIns/herald-mock-otlp"),
        // What the tools share: a TCP connection with a deadline, one plain HTTP/1.1 request, the Prometheus text
        // reader, their JSON reports built as HeraldCore's JSONValue, and the OTLP trace reader and the trace tree
        // (herald-mock-otlp, `heraldctl trace`).
        .target(name: "HeraldToolSupport", dependencies: ["HeraldCore"], path: "Sources/Tools/HeraldToolSupport"),
        // What herald-bench and herald-chaos share: starting (or attaching to) a local stack, the workload (users,
        // conversations, events), the load driver and the ledger of the stand-in's answers.
        .target(
            name: "HeraldBenchSupport",
            dependencies: [
                "HeraldCore", "HeraldConfig", "HeraldKafka", "HeraldRedis", "HeraldToolSupport",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
            ], path: "Sources/Tools/HeraldBenchSupport"),
        .executableTarget(
            name: "herald-bench",
            dependencies: [
                "HeraldBenchSupport", "HeraldCore", "HeraldConfig", "HeraldRedis", "HeraldToolSupport", "HeraldTracing",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ], path: "Sources/Tools/herald-bench"),
        // The fault suite: each scenario on a fresh local stack (scripts/chaos.sh).
        .executableTarget(
            name: "herald-chaos",
            dependencies: [
                "HeraldBenchSupport", "HeraldCore", "HeraldKafka", "HeraldRedis", "HeraldToolSupport",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ], path: "Sources/Tools/herald-chaos"),
        .executableTarget(
            name: "herald-kafka-bench",
            dependencies: [
                "HeraldKafka",
                .product(name: "Logging", package: "swift-log"),
            ], path: "Sources/Tools/herald-kafka-bench"),
        // librdkafka's mock cluster as the local and test broker, on fixed loopback ports, with a control port.
        .executableTarget(
            name: "herald-dev-broker",
            dependencies: [
                "CRdKafka", "CHeraldPortPlan",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ], path: "Sources/Tools/herald-dev-broker"),
        // bind(2) interposed for herald-dev-broker: the mock brokers' listeners get planned ports instead of port 0.
        .target(name: "CHeraldPortPlan", path: "Sources/CShims/CHeraldPortPlan"),
        .executableTarget(
            name: "herald-apns-bench",
            dependencies: [
                "HeraldCore", "HeraldPushProviders", "HeraldToolSupport",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ], path: "Sources/Tools/herald-apns-bench"),

        // MARK: Tests
        // What the test targets share: free ports, child processes, Tansu, redis-server, TLS material, waits on
        // conditions. A regular target (test targets cannot depend on each other) that only test targets use.
        .target(
            name: "HeraldTestSupport", dependencies: ["HeraldCore", "HeraldKafka"], path: "Tests/HeraldTestSupport"),
        .testTarget(
            name: "HeraldCoreTests",
            dependencies: [
                "HeraldCore", "HeraldConfig",
                .product(name: "PropertyBased", package: "swift-property-based"),
            ]),
        .testTarget(
            name: "HeraldPushProvidersTests",
            dependencies: [
                "HeraldPushProviders", "HeraldCore", "HeraldTestSupport",
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
            ]),
        .testTarget(
            name: "HeraldProvidersTests",
            dependencies: [
                "HeraldPushProviders", "HeraldHTTP", "HeraldCore", "HeraldMockProviders", "HeraldTestSupport",
                "HeraldTracing", "HeraldConfig", .product(name: "Logging", package: "swift-log"),
            ]),
        // The shared TLS client context against a TLS server on loopback (the test CA, ALPN, client certificates).
        .testTarget(name: "HeraldTLSTests", dependencies: ["HeraldTLS", "COpenSSL", "HeraldTestSupport"]),
        // send's transports: provider selection, credential reload, unusable credentials, readiness; APNs against
        // the stand-in in-process.
        .testTarget(
            name: "HeraldSendTests",
            dependencies: [
                "HeraldSend", "HeraldPipeline", "HeraldCore", "HeraldPushProviders", "HeraldMockAPNs",
                "HeraldTestSupport",
                .product(name: "Logging", package: "swift-log"),
            ]),
        .testTarget(
            name: "HeraldKafkaTests",
            dependencies: [
                "HeraldKafka", "CRdKafka", "HeraldTestSupport", .product(name: "Logging", package: "swift-log"),
            ]),
        .testTarget(name: "HeraldRedisTests", dependencies: ["HeraldRedis", "HeraldCore", "HeraldTestSupport"]),
        .testTarget(
            name: "HeraldStageTests",
            dependencies: [
                "HeraldStage", "HeraldConfig", "HeraldCore", "HeraldKafka", "HeraldPipeline", "HeraldPushProviders",
                "HeraldTestSupport",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]),
        // The registry API over HTTP: the herald-registry executable against real Redis and Tansu.
        .testTarget(
            name: "HeraldRegistryAPITests",
            dependencies: [
                "HeraldRegistryAPI", "HeraldCore", "HeraldKafka", "HeraldRedis", "HeraldTestSupport",
                .product(name: "Logging", package: "swift-log"),
            ]),
        // Trace context, sampling and the tracing settings (pure; no collector).
        .testTarget(
            name: "HeraldTracingTests",
            dependencies: [
                "HeraldTracing", "HeraldConfig", "HeraldTestSupport",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]),
        .testTarget(name: "HeraldConfigTests", dependencies: ["HeraldConfig", "HeraldCore"]),
        .testTarget(name: "HeraldMockAPNsTests", dependencies: ["HeraldMockAPNs", "HeraldTestSupport"]),
        .testTarget(
            name: "HeraldPipelineTests",
            dependencies: [
                "HeraldPipeline", "HeraldCore", "HeraldConfig", "HeraldMockAPNs",
                .product(name: "PropertyBased", package: "swift-property-based"),
            ]),
        .testTarget(
            name: "HeraldStageLoopTests",
            dependencies: [
                "HeraldStage", "HeraldKafka", "HeraldPipeline", "HeraldCore", "HeraldRedis", "HeraldTestSupport",
                "HeraldTracing", "HeraldConfig",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ]),
        // The OTLP trace reader against hand-built bytes and against what the stages export (HeraldTracing's
        // SpanExport to a receiver on loopback, and to herald-mock-otlp), the span store and the trace tree.
        .testTarget(
            name: "HeraldToolSupportTests",
            dependencies: [
                "HeraldToolSupport", "HeraldTracing", "HeraldConfig", "HeraldTestSupport",
                .product(name: "Logging", package: "swift-log"),
            ]),
        // The benchmarks' own arithmetic (quantiles from histogram buckets) and what the tools share
        // (HeraldToolSupport: the Prometheus text reader, the HTTP probe, the report JSON).
        .testTarget(
            name: "HeraldBenchSupportTests", dependencies: ["HeraldBenchSupport", "HeraldCore", "HeraldToolSupport"]),
        // The whole stack as separate processes (needs `swift build` first; see docs/testing.md).
        .testTarget(
            name: "EndToEndTests",
            dependencies: [
                "HeraldCore", "HeraldConfig", "HeraldKafka", "HeraldRedis", "HeraldPushProviders", "HeraldTestSupport",
                .product(name: "Logging", package: "swift-log"),
            ]),
    ]
)
