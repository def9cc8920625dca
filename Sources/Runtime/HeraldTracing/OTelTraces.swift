import OTel

extension OTel.Configuration {
    /// The swift-otel configuration Herald's stages export spans with: traces only (Herald's metrics stay
    /// Prometheus, its logs JSON lines on stderr), over OTLP/HTTP with protobuf (the only exporter Herald builds:
    /// the `OTLPHTTP` trait), W3C trace context as the only propagator, and every span the stage asks for recorded
    /// (`alwaysOn`): Herald's `TraceSampler` decides which events are traced before any span exists.
    public static func heraldTraces(serviceName: String) -> OTel.Configuration {
        var configuration = OTel.Configuration.default
        configuration.serviceName = serviceName
        configuration.propagators = [.traceContext]
        configuration.metrics.enabled = false
        configuration.logs.enabled = false
        configuration.traces.enabled = true
        configuration.traces.sampler = .alwaysOn
        configuration.traces.exporter = .otlp
        configuration.traces.otlpExporter.protocol = .httpProtobuf
        return configuration
    }
}
