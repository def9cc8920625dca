import Glibc
import HeraldConfig

/// A tracing setting from the environment that does not read; the stage stops at startup (status 2), as for a
/// `HERALD_*` key. The message never holds the value of `OTEL_EXPORTER_OTLP_HEADERS` (it holds credentials).
public struct TracingConfigurationError: Error, Sendable, Hashable, CustomStringConvertible {
    public var key: String
    public var message: String
    public var description: String { "\(key): \(message)" }
}

/// One standard OpenTelemetry environment variable Herald reads, and its line in docs/operations.md ("Tracing").
public struct TracingEnvironmentKey: Sendable, Hashable {
    public let name: String
    public let documentedDefault: String
    public let meaning: String
}

/// Tracing as a stage runs it: the pipeline file's `tracing:` section with the standard `OTEL_*` environment
/// variables applied over it (docs/operations.md, "Tracing").
public struct TracingSettings: Sendable {
    /// Off, no trace header is read or written and nothing is allocated per record for tracing.
    public var enabled: Bool
    /// The share of events without an incoming `traceparent` that start a trace (`TraceSampler`).
    public var sampleRatio: Double
    /// Where spans are sent: the full OTLP/HTTP traces URL.
    public var tracesEndpoint: String
    public var serviceName: String
    public var resourceAttributes: [String: String]
    /// Extra HTTP headers of each export request (a collector's API key): credentials, never logged.
    public var exportHeaders: [(String, String)]
    public var maxQueueSpans: Int
    public var maxBatchSpans: Int
    public var exportInterval: Duration
    /// The longest one export request may take; its spans are dropped after it. 10 s, the OTLP exporter's default;
    /// not a pipeline key.
    public var exportTimeout: Duration = .seconds(10)
    /// A PEM file of the CAs to trust for an `https://` endpoint instead of the system's store; nil: the system's.
    public var certificateFile: String?

    public static let defaultEndpoint = "http://localhost:4318"

    // MARK: The environment

    public static let sdkDisabled = TracingEnvironmentKey(
        name: "OTEL_SDK_DISABLED", documentedDefault: "`false`",
        meaning: "`true` turns tracing off whatever the pipeline file says")
    public static let exporterEndpoint = TracingEnvironmentKey(
        name: "OTEL_EXPORTER_OTLP_ENDPOINT", documentedDefault: "pipeline `tracing.endpoint` (`http://localhost:4318`)",
        meaning: "the OTLP/HTTP collector's base URL (`/v1/traces` is appended); set, it turns tracing on")
    public static let tracesEndpoint = TracingEnvironmentKey(
        name: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", documentedDefault: "(unset)",
        meaning:
            "the full traces URL, used as it is; set, it turns tracing on and wins over `OTEL_EXPORTER_OTLP_ENDPOINT`")
    public static let exporterHeaders = TracingEnvironmentKey(
        name: "OTEL_EXPORTER_OTLP_HEADERS", documentedDefault: "(unset)",
        meaning:
            "`name=value,name=value` (values URL-encoded) sent with each export request, e.g. a collector's API key; never logged"
    )
    public static let exporterTimeout = TracingEnvironmentKey(
        name: "OTEL_EXPORTER_OTLP_TIMEOUT", documentedDefault: "`10000`",
        meaning: "milliseconds one export request may take (1 to 600,000); its spans are dropped after it")
    public static let exporterCertificate = TracingEnvironmentKey(
        name: "OTEL_EXPORTER_OTLP_CERTIFICATE", documentedDefault: "(the system's CA store)",
        meaning: "a PEM file of the CAs to trust for an `https://` collector (a private CA); it must be readable")
    public static let samplerArgument = TracingEnvironmentKey(
        name: "OTEL_TRACES_SAMPLER_ARG", documentedDefault: "pipeline `tracing.sample_ratio` (0.01)",
        meaning: "the share of events without a `traceparent` that start a trace, 0 to 1")
    public static let serviceNameKey = TracingEnvironmentKey(
        name: "OTEL_SERVICE_NAME", documentedDefault: "pipeline `tracing.service_name` (the stage's name)",
        meaning: "`service.name` of the spans")
    public static let resourceAttributesKey = TracingEnvironmentKey(
        name: "OTEL_RESOURCE_ATTRIBUTES", documentedDefault: "pipeline `tracing.resource_attributes`",
        meaning:
            "`key=value,key=value` (values URL-encoded) resource attributes, e.g. `k8s.pod.name=$(POD_NAME)`; over the file's"
    )

    /// Every `OTEL_*` variable Herald reads, in the order docs/operations.md lists them.
    public static let environmentKeys = [
        sdkDisabled, exporterEndpoint, tracesEndpoint, exporterHeaders, exporterTimeout, exporterCertificate,
        samplerArgument, serviceNameKey, resourceAttributesKey,
    ]

    /// docs/operations.md's table of the `OTEL_*` variables (a test compares them).
    public static var markdownTable: String {
        (["| variable | default | meaning |", "| --- | --- | --- |"]
            + environmentKeys.map { "| `\($0.name)` | \($0.documentedDefault) | \($0.meaning) |" })
            .joined(separator: "\n")
    }

    /// The settings of `stage` (its executable's name, the default service name) from the pipeline file's section
    /// and the environment.
    public init(
        file: TracingConfig, environment: [String: String], stage: String
    ) throws(TracingConfigurationError) {
        func value(_ key: TracingEnvironmentKey) -> String? {
            guard let v = environment[key.name]?.trimmingWhitespace, !v.isEmpty else { return nil }
            return v
        }
        var enabled = file.enabled
        var endpoint = file.endpoint.map(Self.tracesURL) ?? Self.tracesURL(Self.defaultEndpoint)
        if let base = value(Self.exporterEndpoint) {
            try Self.checkURL(base, key: Self.exporterEndpoint)
            endpoint = Self.tracesURL(base)
            enabled = true
        }
        if let full = value(Self.tracesEndpoint) {
            try Self.checkURL(full, key: Self.tracesEndpoint)
            endpoint = full
            enabled = true
        }
        if let disabled = value(Self.sdkDisabled) {
            switch disabled.lowercased() {
            case "true": enabled = false
            case "false": break
            default: throw TracingConfigurationError(key: Self.sdkDisabled.name, message: "expected true or false")
            }
        }
        var ratio = file.sampleRatio
        if let text = value(Self.samplerArgument) {
            guard let v = Double(text), v >= 0, v <= 1 else {
                throw TracingConfigurationError(
                    key: Self.samplerArgument.name, message: "expected a number from 0 to 1, got \(text)")
            }
            ratio = v
        }
        var attributes = file.resourceAttributes
        if let text = value(Self.resourceAttributesKey) {
            for (key, v) in try Self.pairs(text, key: Self.resourceAttributesKey) { attributes[key] = v }
        }
        let headers = try value(Self.exporterHeaders).map { text throws(TracingConfigurationError) in
            try Self.pairs(text, key: Self.exporterHeaders)
        }
        self.enabled = enabled
        self.sampleRatio = ratio
        self.tracesEndpoint = endpoint
        self.serviceName = value(Self.serviceNameKey) ?? file.serviceName ?? stage
        self.resourceAttributes = attributes
        self.exportHeaders = headers ?? []
        self.maxQueueSpans = file.maxQueueSpans
        self.maxBatchSpans = file.maxBatchSpans
        self.exportInterval = .milliseconds(file.exportIntervalMs)
        if let text = value(Self.exporterTimeout) {
            guard let milliseconds = Int(text), (1...600_000).contains(milliseconds) else {
                throw TracingConfigurationError(
                    key: Self.exporterTimeout.name, message: "expected milliseconds from 1 to 600000, got \(text)")
            }
            self.exportTimeout = .milliseconds(milliseconds)
        }
        if let path = value(Self.exporterCertificate) {
            guard access(path, R_OK) == 0 else {
                throw TracingConfigurationError(key: Self.exporterCertificate.name, message: "\(path) is not readable")
            }
            self.certificateFile = path
        }
    }

    /// The sampler these settings describe.
    public var sampler: TraceSampler { TraceSampler(ratio: sampleRatio) }

    /// The resource every span of the stage is exported under: `service.name`, the SDK's name and language, and
    /// the configured resource attributes (a `service.name` among them is replaced by `serviceName`), by key.
    public var resource: [(key: String, value: SpanValue)] {
        var attributes = resourceAttributes
        attributes["service.name"] = serviceName
        attributes["telemetry.sdk.name"] = attributes["telemetry.sdk.name"] ?? "herald"
        attributes["telemetry.sdk.language"] = attributes["telemetry.sdk.language"] ?? "swift"
        return attributes.sorted { $0.key < $1.key }.map { ($0.key, .string($0.value)) }
    }

    // MARK: Reading values

    /// The OTLP/HTTP traces URL of a collector's base URL.
    static func tracesURL(_ base: String) -> String {
        base.hasSuffix("/") ? base + "v1/traces" : base + "/v1/traces"
    }

    static func checkURL(_ url: String, key: TracingEnvironmentKey) throws(TracingConfigurationError) {
        guard url.hasPrefix("http://") || url.hasPrefix("https://"), !url.contains(" ") else {
            throw TracingConfigurationError(key: key.name, message: "expected an http:// or https:// URL")
        }
    }

    /// The W3C-baggage-like `key=value,key=value` list of `OTEL_RESOURCE_ATTRIBUTES` and
    /// `OTEL_EXPORTER_OTLP_HEADERS`: keys and values trimmed, values percent-decoded, empty members skipped. An
    /// error names the member's position, never its value.
    static func pairs(
        _ text: String, key: TracingEnvironmentKey
    ) throws(TracingConfigurationError) -> [(String, String)] {
        var result: [(String, String)] = []
        for (index, member) in text.split(separator: ",", omittingEmptySubsequences: false).enumerated() {
            let trimmed = String(member).trimmingWhitespace
            if trimmed.isEmpty { continue }
            guard let equals = trimmed.firstIndex(of: "=") else {
                throw TracingConfigurationError(key: key.name, message: "member \(index + 1) is not name=value")
            }
            let name = String(trimmed[..<equals]).trimmingWhitespace
            let raw = String(trimmed[trimmed.index(after: equals)...]).trimmingWhitespace
            guard !name.isEmpty, let decoded = percentDecoded(raw) else {
                throw TracingConfigurationError(
                    key: key.name, message: "member \(index + 1) has an empty name or a bad %-escape")
            }
            result.append((name, decoded))
        }
        return result
    }

    /// `text` with `%XX` escapes decoded; nil when an escape is malformed or the result is not UTF-8.
    static func percentDecoded(_ text: String) -> String? {
        var bytes: [UInt8] = []
        var utf8 = text.utf8.makeIterator()
        while let c = utf8.next() {
            guard c == UInt8(ascii: "%") else {
                bytes.append(c)
                continue
            }
            guard let h = utf8.next(), let l = utf8.next(), let high = hexValue(h), let low = hexValue(l) else {
                return nil
            }
            bytes.append(high << 4 | low)
        }
        return String(validating: bytes, as: UTF8.self)
    }

    private static func hexValue(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

extension String {
    fileprivate var trimmingWhitespace: String {
        var scalars = Substring(self)
        while let first = scalars.first, first == " " || first == "\t" { scalars.removeFirst() }
        while let last = scalars.last, last == " " || last == "\t" { scalars.removeLast() }
        return String(scalars)
    }
}
