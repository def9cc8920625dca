// The pipeline file's `tracing:` section (HeraldConfig): defaults, values, and what is refused.

import HeraldConfig
import Testing

@Suite("Pipeline configuration: tracing")
struct TracingConfigTests {
    @Test("without a tracing section tracing is off, at the default ratio 0.01")
    func defaults() throws {
        let tracing = try PipelineLoader.load(yaml: "kafka: {brokers: x:1}").config.tracing
        #expect(tracing == TracingConfig())
        #expect(!tracing.enabled && tracing.sampleRatio == 0.01 && tracing.endpoint == nil)
        #expect(tracing.maxQueueSpans == 2048 && tracing.maxBatchSpans == 512 && tracing.exportIntervalMs == 5000)
    }

    @Test("every key is read")
    func values() throws {
        let loaded = try PipelineLoader.load(
            yaml: """
                tracing:
                  enabled: true
                  sample_ratio: 0.25
                  endpoint: http://collector:4318
                  service_name: herald-eu
                  resource_attributes: {deployment.environment: staging}
                  max_queue_spans: 100
                  max_batch_spans: 10
                  export_interval_ms: 250
                """)
        #expect(loaded.warnings.isEmpty)
        let t = loaded.config.tracing
        #expect(t.enabled && t.sampleRatio == 0.25 && t.endpoint == "http://collector:4318")
        #expect(t.serviceName == "herald-eu" && t.resourceAttributes == ["deployment.environment": "staging"])
        #expect(t.maxQueueSpans == 100 && t.maxBatchSpans == 10 && t.exportIntervalMs == 250)
    }

    @Test("an unknown key is a warning with its path")
    func unknownKey() throws {
        let loaded = try PipelineLoader.load(yaml: "tracing: {enabled: true, sample_rate: 0.5}")
        #expect(loaded.warnings.count == 1 && loaded.warnings[0].hasPrefix("tracing.sample_rate: unknown key"))
    }

    @Test(
        "a ratio outside 0...1, a URL that is not http(s), or a batch larger than the queue is refused, naming the key",
        arguments: [
            ("tracing: {sample_ratio: 1.5}", "tracing.sample_ratio"),
            ("tracing: {sample_ratio: -0.1}", "tracing.sample_ratio"),
            ("tracing: {sample_ratio: often}", "tracing.sample_ratio"),
            ("tracing: {endpoint: 'collector:4318'}", "tracing.endpoint"),
            ("tracing: {enabled: maybe}", "tracing.enabled"),
            ("tracing: {max_queue_spans: 0}", "tracing.max_queue_spans"),
            ("tracing: {max_queue_spans: 10, max_batch_spans: 11}", "tracing.max_batch_spans"),
            ("tracing: {export_interval_ms: 0}", "tracing.export_interval_ms"),
        ])
    func refused(yaml: String, path: String) {
        #expect {
            try PipelineLoader.load(yaml: yaml)
        } throws: { error in
            (error as? ConfigError)?.path == path
        }
    }
}
