// The swift-otel configuration Herald's stages start from.

import HeraldTracing
import OTel
import Testing

@Suite("OTel configuration")
struct OTelTracesTests {
    @Test("traces only, over OTLP/HTTP with protobuf, every span recorded, named as given")
    func heraldTraces() {
        let configuration = OTel.Configuration.heraldTraces(serviceName: "herald-ingest")
        #expect(configuration.serviceName == "herald-ingest")
        #expect(configuration.traces.enabled && !configuration.metrics.enabled && !configuration.logs.enabled)
        #expect(configuration.traces.otlpExporter.protocol == .httpProtobuf)
        #expect(configuration.propagators.count == 1)
    }
}
