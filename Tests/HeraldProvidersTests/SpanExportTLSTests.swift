// The span exporter to an `https://` collector: TLS verified against OTEL_EXPORTER_OTLP_CERTIFICATE, the export
// headers sent. The stand-in's webhook receiver plays the collector: it records what arrives over TLS (and answers
// 400 to a body that is not JSON, which the exporter counts as a failed export).

import Foundation
import HeraldConfig
import HeraldMockProviders
import HeraldTestSupport
import HeraldTracing
import Logging
import Synchronization
import Testing

/// Spans the exporter reported as a failed export.
final class FailedExports: Sendable {
    private let count = Mutex(0)
    func add(_ n: Int) { count.withLock { $0 += n } }
    var value: Int { count.withLock { $0 } }
}

@Suite("Span export over TLS", .serialized)
struct SpanExportTLSTests {
    static func export(
        to port: Int, certificate: String?, failed: FailedExports
    ) throws -> SpanExport {
        var environment = [
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://127.0.0.1:\(port)/webhook/otlp",
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Basic%20b3RlbDpzM2NyZXQ=",
        ]
        if let certificate { environment["OTEL_EXPORTER_OTLP_CERTIFICATE"] = certificate }
        var file = TracingConfig()
        file.maxBatchSpans = 1
        let settings = try TracingSettings(file: file, environment: environment, stage: "herald-send")
        return try SpanExport(settings: settings, logger: Logger(label: "test")) { reason, count in
            if reason == "export_failed" { failed.add(count) }
        }
    }

    static func span(_ export: SpanExport) {
        let parent = TraceContext(traceIDHigh: 1, traceIDLow: 2, spanID: 3, flags: 1)
        let span = export.startSpan("herald-send process", continuing: parent, kind: .consumer, startNanoseconds: 10)
        span.end(atNanoseconds: 20)
    }

    @Test("trusting the collector's CA, the request arrives over TLS with the export headers")
    func trusted() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki)
        defer { server.stop() }
        let failed = FailedExports()
        let export = try Self.export(to: server.port, certificate: pki.cert, failed: failed)
        let running = Task { try await export.service.run() }
        Self.span(export)
        try await waitUntil("the export request arrives") { !server.recorded(.webhook).isEmpty }
        running.cancel()
        try await running.value
        let got = try #require(server.recorded(.webhook).first)
        #expect(got.target == "otlp" && got.authorization == "Basic b3RlbDpzM2NyZXQ=")
        #expect(got.body.count > 20 && String(decoding: got.body, as: UTF8.self).contains("herald-send process"))
    }

    @Test("without the CA the handshake fails: nothing arrives and the span is counted as a failed export")
    func untrusted() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki)
        defer { server.stop() }
        let failed = FailedExports()
        let export = try Self.export(to: server.port, certificate: nil, failed: failed)
        let running = Task { try await export.service.run() }
        Self.span(export)
        try await waitUntil("the export fails") { failed.value == 1 }
        running.cancel()
        try await running.value
        #expect(server.recorded(.webhook).isEmpty)
    }
}
