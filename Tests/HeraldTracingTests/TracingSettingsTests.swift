// TracingSettings: the pipeline file's `tracing:` section with the standard OTEL_* variables over it.

import Foundation
import HeraldConfig
import HeraldTestSupport
import HeraldTracing
import Testing

@Suite("Tracing settings")
struct TracingSettingsTests {
    @Test("with neither the file nor the environment, tracing is off, ratio 0.01, named after the stage")
    func defaults() throws {
        let settings = try TracingSettings(file: TracingConfig(), environment: [:], stage: "herald-ingest")
        #expect(!settings.enabled && settings.sampleRatio == 0.01 && settings.sampler.ratio == 0.01)
        #expect(settings.serviceName == "herald-ingest" && settings.resourceAttributes.isEmpty)
        #expect(settings.tracesEndpoint == "http://localhost:4318/v1/traces" && settings.exportHeaders.isEmpty)
        #expect(settings.maxQueueSpans == 2048 && settings.maxBatchSpans == 512)
        #expect(settings.exportInterval == .seconds(5))
    }

    @Test("the file's section is taken as it is")
    func file() throws {
        var file = TracingConfig()
        file.enabled = true
        file.sampleRatio = 0.5
        file.endpoint = "https://collector.example:4318/"
        file.serviceName = "herald"
        file.resourceAttributes = ["deployment.environment": "staging"]
        let settings = try TracingSettings(file: file, environment: [:], stage: "herald-send")
        #expect(settings.enabled && settings.sampleRatio == 0.5 && settings.serviceName == "herald")
        #expect(settings.tracesEndpoint == "https://collector.example:4318/v1/traces")
        #expect(settings.resourceAttributes == ["deployment.environment": "staging"])
    }

    @Test("the OTEL_* variables override the file")
    func environment() throws {
        var file = TracingConfig()
        file.resourceAttributes = ["deployment.environment": "staging", "team": "chat"]
        let settings = try TracingSettings(
            file: file,
            environment: [
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector:4318",
                "OTEL_TRACES_SAMPLER_ARG": "0.2",
                "OTEL_SERVICE_NAME": "herald-eu",
                "OTEL_RESOURCE_ATTRIBUTES": "k8s.pod.name=send-7f9c, deployment.environment=prod%2Ceu",
                "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=s3cr%3Dt,x-team=chat",
            ], stage: "herald-send")
        #expect(settings.enabled, "an endpoint in the environment turns tracing on")
        #expect(settings.tracesEndpoint == "http://otel-collector:4318/v1/traces")
        #expect(settings.sampleRatio == 0.2 && settings.serviceName == "herald-eu")
        #expect(
            settings.resourceAttributes == [
                "k8s.pod.name": "send-7f9c", "deployment.environment": "prod,eu", "team": "chat",
            ])
        #expect(settings.exportHeaders.map { "\($0.0)=\($0.1)" } == ["x-api-key=s3cr=t", "x-team=chat"])
    }

    @Test("the traces endpoint is used as it is and wins; OTEL_SDK_DISABLED=true turns tracing off")
    func tracesEndpointAndDisabled() throws {
        var file = TracingConfig()
        file.enabled = true
        let full = try TracingSettings(
            file: file,
            environment: [
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b/traces",
            ], stage: "s")
        #expect(full.tracesEndpoint == "http://b/traces")
        let off = try TracingSettings(
            file: file, environment: ["OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318"],
            stage: "s")
        #expect(!off.enabled)
        let empty = try TracingSettings(file: file, environment: ["OTEL_TRACES_SAMPLER_ARG": "  "], stage: "s")
        #expect(empty.sampleRatio == 0.01, "an empty variable is unset")
    }

    @Test(
        "a value that does not read is an error naming the variable, and never quoting a header's value",
        arguments: [
            ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
            ("OTEL_TRACES_SAMPLER_ARG", "often"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "grpc://collector"),
            ("OTEL_SDK_DISABLED", "yes"),
            ("OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=topsecret%zz"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "=topsecret"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "0"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "600001"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem"),
        ])
    func refused(key: String, value: String) {
        #expect {
            try TracingSettings(file: TracingConfig(), environment: [key: value], stage: "s")
        } throws: { error in
            guard let error = error as? TracingConfigurationError else { return false }
            return error.key == key && !error.description.contains("topsecret")
        }
    }

    @Test("the exporter's settings: endpoint, headers, queue, batch and interval, and the resource of the spans")
    func exporterSettings() throws {
        var file = TracingConfig()
        file.enabled = true
        file.maxQueueSpans = 100
        file.maxBatchSpans = 10
        file.exportIntervalMs = 250
        file.resourceAttributes = ["deployment.environment": "prod", "service.name": "ignored"]
        let settings = try TracingSettings(
            file: file,
            environment: ["OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=k", "OTEL_RESOURCE_ATTRIBUTES": "k8s.pod.name=p"],
            stage: "herald-render")
        #expect(settings.tracesEndpoint == "http://localhost:4318/v1/traces")
        #expect(settings.exportHeaders.map(\.0) == ["x-api-key"])
        #expect(settings.maxQueueSpans == 100 && settings.maxBatchSpans == 10)
        #expect(settings.exportInterval == .milliseconds(250) && settings.exportTimeout == .seconds(10))
        #expect(settings.certificateFile == nil)
        let tuned = try TracingSettings(
            file: file,
            environment: [
                "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
                "OTEL_EXPORTER_OTLP_CERTIFICATE": Paths.packageRoot + "/README.md",
            ], stage: "herald-render")
        #expect(tuned.exportTimeout == .milliseconds(2500))
        #expect(tuned.certificateFile == Paths.packageRoot + "/README.md")
        #expect(
            settings.resource.map { "\($0.key)=\($0.value)" } == [
                "deployment.environment=string(\"prod\")", "k8s.pod.name=string(\"p\")",
                "service.name=string(\"herald-render\")", "telemetry.sdk.language=string(\"swift\")",
                "telemetry.sdk.name=string(\"herald\")",
            ])
    }

    @Test("docs/operations.md's table of OTEL_* variables is the one TracingSettings declares")
    func docsTable() throws {
        let text = try String(contentsOfFile: Paths.packageRoot + "/docs/operations.md", encoding: .utf8)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let start = try #require(lines.firstIndex(of: "| variable | default | meaning |"))
        let documented = lines[start...].prefix { $0.hasPrefix("|") }.joined(separator: "\n")
        #expect(
            documented == TracingSettings.markdownTable,
            "replace the table in docs/operations.md, \"Tracing\", with:\n\(TracingSettings.markdownTable)")
    }
}
