import HeraldKafka
import HeraldPipeline
import Testing

@testable import HeraldStage

/// What suppress's timers produce (`FlushTimer.record`): a flush, summary or digest that kept a traced message's
/// context carries it as its `traceparent` and `tracestate` headers; an untraced one has no header at all.
@Suite("Flush timer records")
struct FlushRecordTests {
    static let output = StageOutput(topic: "herald.deliverable", key: "u2", value: [0, 72, 1, 2])
    static let traceparent = Array("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".utf8)

    @Test("a traced output carries traceparent and tracestate; one without tracestate only traceparent")
    func traced() {
        let record = FlushTimer.record(
            FlushOutput(
                Self.output, trace: TracePropagation(traceparent: Self.traceparent, tracestate: Array("v=1".utf8))))
        #expect(
            record.topic == "herald.deliverable" && record.key == Array("u2".utf8) && record.value == [0, 72, 1, 2])
        #expect(
            record.headers == [
                KafkaHeader(key: "traceparent", value: Self.traceparent), KafkaHeader(key: "tracestate", string: "v=1"),
            ])
        let bare = FlushTimer.record(FlushOutput(Self.output, trace: TracePropagation(traceparent: Self.traceparent)))
        #expect(bare.headers == [KafkaHeader(key: "traceparent", value: Self.traceparent)])
    }

    @Test("an untraced output has no header")
    func untraced() {
        let record = FlushTimer.record(FlushOutput(Self.output))
        #expect(record.headers.isEmpty && record.value == Self.output.value)
    }
}
