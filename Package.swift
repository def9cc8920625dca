// swift-tools-version:6.0
// Herald: a push-notification back end for chat services. Linux only (Glibc, epoll; Debian 12 is the reference).
//
// Layers (each imports only what is listed below it; docs/architecture.md says more):
//   executables: the six stages (herald-ingest, -resolve, -suppress, -render, -send, -registry), heraldctl,
//                herald-mock-apns, herald-bench, herald-kafka-bench, herald-apns-bench
//     -> HeraldStage      what every stage process shares: batch loop, /metrics and health endpoint, lifecycle, logs
//     -> HeraldPipeline   what each stage does to a batch, pure over ports (it opens no socket itself)
//        and the adapters HeraldKafka, HeraldRedis, HeraldAPNs, each over its own C module
//        (CRdKafka, CHiredis, CNghttp2 + COpenSSL); the pipeline and the adapters do not import each other
//     -> HeraldConfig     pipeline YAML -> typed configuration, unknown-key warnings
//     -> HeraldCore       pure: events, state, rules, rendering, payloads, APNs answer table, record codecs
//   HeraldMockAPNs (+ CHeraldMockTLS): the APNs stand-in as a library; on purpose it imports none of the above,
//   so it checks requests independently of the code under test.
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
    ],
    targets: [
        // MARK: Pure core
        .target(name: "HeraldCore"),
        .target(name: "HeraldConfig", dependencies: [
            "HeraldCore",
            .product(name: "Yams", package: "Yams"),
        ]),

        // MARK: C libraries (system-library targets: modulemap + shim.h + pkg-config)
        .systemLibrary(name: "CRdKafka", pkgConfig: "rdkafka", providers: [.apt(["librdkafka-dev"])]),
        .systemLibrary(name: "CHiredis", pkgConfig: "hiredis", providers: [.apt(["libhiredis-dev"])]),
        .systemLibrary(name: "CNghttp2", pkgConfig: "libnghttp2", providers: [.apt(["libnghttp2-dev"])]),
        .systemLibrary(name: "COpenSSL", pkgConfig: "openssl", providers: [.apt(["libssl-dev"])]),

        // Typed wrappers over libcurl's variadic setters (HTTP/1.1 work: FCM OAuth, webhooks).
        .target(name: "CHeraldCurl", linkerSettings: [.linkedLibrary("curl")]),

        // MARK: Adapters
        .target(name: "HeraldHTTP", dependencies: ["CHeraldCurl", "HeraldCore"]),
        .target(name: "HeraldKafka", dependencies: [
            "CRdKafka", "HeraldCore",
            .product(name: "Logging", package: "swift-log"),
            .product(name: "Metrics", package: "swift-metrics"),
        ]),
        .target(name: "HeraldRedis", dependencies: [
            "CHiredis", "HeraldCore",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .target(name: "HeraldAPNs", dependencies: [
            "CNghttp2", "COpenSSL", "HeraldCore", "HeraldHTTP",
            .product(name: "Logging", package: "swift-log"),
            .product(name: "Metrics", package: "swift-metrics"),
        ]),

        // MARK: Per-stage processing (pure over ports: unit-testable without Kafka, Redis or APNs)
        .target(name: "HeraldPipeline", dependencies: ["HeraldCore", "HeraldConfig"]),

        // MARK: What every stage executable shares
        .target(name: "HeraldStage", dependencies: [
            "HeraldCore", "HeraldConfig", "HeraldKafka", "HeraldRedis", "HeraldPipeline",
            .product(name: "Logging", package: "swift-log"),
            .product(name: "Metrics", package: "swift-metrics"),
            .product(name: "Prometheus", package: "swift-prometheus"),
            .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            .product(name: "UnixSignals", package: "swift-service-lifecycle"),
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "NIOHTTP1", package: "swift-nio"),
        ]),

        // MARK: Executables
        // The six pipeline stages: a page each (configuration, adapters, run).
        .executableTarget(name: "herald-ingest", dependencies: ["HeraldStage", "HeraldPipeline", "HeraldConfig"]),
        .executableTarget(name: "herald-resolve", dependencies: ["HeraldStage", "HeraldPipeline", "HeraldConfig", "HeraldRedis"]),
        .executableTarget(name: "herald-suppress", dependencies: ["HeraldStage", "HeraldPipeline", "HeraldConfig"]),
        .executableTarget(name: "herald-render", dependencies: ["HeraldStage", "HeraldPipeline", "HeraldConfig"]),
        .executableTarget(name: "herald-send", dependencies: [
            "HeraldStage", "HeraldPipeline", "HeraldConfig", "HeraldCore", "HeraldRedis", "HeraldAPNs", "HeraldHTTP",
            .product(name: "Logging", package: "swift-log"),
            .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
        ]),
        .executableTarget(name: "herald-registry", dependencies: ["HeraldStage", "HeraldPipeline", "HeraldConfig", "HeraldRedis"]),
        .executableTarget(name: "heraldctl", dependencies: [
            "HeraldCore", "HeraldConfig", "HeraldAPNs", "HeraldHTTP", "HeraldKafka", "HeraldRedis",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ]),
        .executableTarget(name: "herald-mock-apns", dependencies: [
            "HeraldMockAPNs",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ]),
        // The APNs stand-in as a library (checks, faults, recording, HTTP/2 server) so it is testable.
        .target(name: "HeraldMockAPNs", dependencies: ["CNghttp2", "CHeraldMockTLS"]),
        // OpenSSL server setup and ES256 verification for the stand-in (OpenSSL macros are not importable).
        .target(name: "CHeraldMockTLS", linkerSettings: [.linkedLibrary("ssl"), .linkedLibrary("crypto")]),
        // The FCM (token endpoint + messages:send over HTTP/2) and custom-webhook stand-in, as a library.
        .target(name: "HeraldMockProviders", dependencies: ["CNghttp2", "COpenSSL"]),
        .executableTarget(name: "herald-mock-fcm", dependencies: [
            "HeraldMockProviders",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ]),
        .executableTarget(name: "herald-bench", dependencies: [
            "HeraldCore", "HeraldConfig", "HeraldKafka", "HeraldRedis",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
            .product(name: "Histogram", package: "hdrhistogram-swift"),
        ]),
        .executableTarget(name: "herald-kafka-bench", dependencies: [
            "HeraldKafka",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .executableTarget(name: "herald-apns-bench", dependencies: [
            "HeraldCore", "HeraldAPNs",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ]),

        // MARK: Tests
        // What the test targets share: free ports, child processes, Tansu, redis-server, TLS material, waits on
        // conditions. A regular target (test targets cannot depend on each other) that only test targets use.
        .target(name: "HeraldTestSupport", dependencies: ["HeraldCore", "HeraldKafka"], path: "Tests/HeraldTestSupport"),
        .testTarget(name: "HeraldCoreTests", dependencies: [
            "HeraldCore", "HeraldConfig",
            .product(name: "PropertyBased", package: "swift-property-based"),
        ]),
        .testTarget(name: "HeraldAPNsTests", dependencies: [
            "HeraldAPNs", "HeraldCore", "COpenSSL", "HeraldTestSupport",
            .product(name: "Metrics", package: "swift-metrics"),
            .product(name: "MetricsTestKit", package: "swift-metrics"),
        ]),
        .testTarget(name: "HeraldProvidersTests", dependencies: [
            "HeraldAPNs", "HeraldHTTP", "HeraldCore", "HeraldMockProviders", "COpenSSL",
        ]),
        .testTarget(name: "HeraldKafkaTests", dependencies: ["HeraldKafka", "CRdKafka", "HeraldTestSupport"]),
        .testTarget(name: "HeraldRedisTests", dependencies: ["HeraldRedis", "HeraldCore", "HeraldTestSupport"]),
        .testTarget(name: "HeraldStageTests", dependencies: ["HeraldStage", "HeraldCore", "HeraldTestSupport"]),
        .testTarget(name: "HeraldConfigTests", dependencies: ["HeraldConfig", "HeraldCore"]),
        .testTarget(name: "HeraldMockAPNsTests", dependencies: ["HeraldMockAPNs", "HeraldTestSupport"]),
        .testTarget(name: "HeraldPipelineTests", dependencies: ["HeraldPipeline", "HeraldCore", "HeraldConfig"]),
        .testTarget(name: "HeraldStageLoopTests", dependencies: [
            "HeraldStage", "HeraldKafka", "HeraldPipeline", "HeraldCore", "HeraldTestSupport",
            .product(name: "Logging", package: "swift-log"),
            .product(name: "Metrics", package: "swift-metrics"),
        ]),
        // The whole stack as separate processes (needs `swift build` first; see docs/testing.md).
        .testTarget(name: "EndToEndTests", dependencies: [
            "HeraldCore", "HeraldConfig", "HeraldKafka", "HeraldRedis", "HeraldTestSupport",
            .product(name: "Logging", package: "swift-log"),
        ]),
    ]
)
