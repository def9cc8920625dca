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

    @Test("blank OTEL_* variables are unset for swift-otel as they are for Herald; others stay")
    func blankVariablesAreRemoved() {
        let environment = [
            "OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_SERVICE_NAME": "  ", "OTEL_TRACES_SAMPLER_ARG": "0.5",
            "HERALD_EMPTY": "", "PATH": "/usr/bin",
        ]
        #expect(SpanExport.blankVariables(in: environment) == ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME"])
        #expect(SpanExport.blankVariables(in: ["OTEL_SDK_DISABLED": "false"]).isEmpty)
    }
}
