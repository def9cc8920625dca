// W3C trace context: reading and writing `traceparent` and `tracestate` (https://www.w3.org/TR/trace-context/).

import HeraldTracing
import Testing

@Suite("Trace context")
struct TraceContextTests {
    static let example = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    @Test("the specification's example reads into its ids and flags, and writes back byte for byte")
    func example() throws {
        let context = try #require(TraceContext(traceparent: Array(Self.example.utf8)))
        #expect(context.traceIDHigh == 0x4bf9_2f35_77b3_4da6 && context.traceIDLow == 0xa3ce_929d_0e0e_4736)
        #expect(context.spanID == 0x00f0_67aa_0ba9_02b7 && context.flags == 0x01 && context.isSampled)
        #expect(context.traceState == nil)
        #expect(context.traceparent == Self.example && context.traceparentBytes == Array(Self.example.utf8))
        #expect(context.traceIDHex == "4bf92f3577b34da6a3ce929d0e0e4736" && context.spanIDHex == "00f067aa0ba902b7")
    }

    @Test("flags other than sampled are kept; flag 00 is not sampled")
    func flags() throws {
        let unsampled = try #require(
            TraceContext(traceparent: Array("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00".utf8)))
        #expect(!unsampled.isSampled)
        let other = try #require(
            TraceContext(traceparent: Array("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03".utf8)))
        #expect(other.isSampled && other.flags == 0x03 && other.traceparent.hasSuffix("-03"))
    }

    @Test("a later version is read by its first four fields and written as version 00")
    func laterVersion() throws {
        let context = try #require(
            TraceContext(traceparent: Array("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes".utf8)))
        #expect(context.traceparent == Self.example)
        #expect(
            TraceContext(traceparent: Array("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x".utf8)) == nil)
    }

    @Test(
        "a traceparent that is not valid gives no context (the event is treated as one without)",
        arguments: [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  // no flags
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",  // version 00 with more
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  // upper case
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  // zero trace id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  // zero parent id
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // version ff
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // separator
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",  // not hex
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",  // flags not hex
            "0-04bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // shifted
        ])
    func invalid(value: String) {
        #expect(TraceContext(traceparent: Array(value.utf8)) == nil)
    }

    @Test("bytes that are not text at all give no context and do not trap")
    func garbage() {
        #expect(TraceContext(traceparent: [UInt8](repeating: 0xFF, count: 55)) == nil)
        #expect(TraceContext(traceparent: [UInt8](repeating: 0x2D, count: 200)) == nil)
    }

    @Test(
        "a valid tracestate is kept as received; one that is not is dropped and the context stays",
        arguments: [
            ("congo=t61rcWkgMzE", "congo=t61rcWkgMzE"),
            ("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
            ("rojo=1, ,congo=2", "rojo=1, ,congo=2"),
            ("", nil),
            (" , ", nil),
            ("novalue", nil),
            ("=value", nil),
            ("key=", nil),
            ("k=\u{7}", nil),
            (String(repeating: "a=b,", count: 33), nil),  // 33 members
            ("a=" + String(repeating: "x", count: 511), nil),  // 513 bytes
        ] as [(String, String?)])
    func traceState(value: String, kept: String?) throws {
        let context = try #require(TraceContext(traceparent: Array(Self.example.utf8), tracestate: Array(value.utf8)))
        #expect(context.traceState == kept)
        #expect(context.spanID == 0x00f0_67aa_0ba9_02b7)
    }

    @Test("continuing from a span keeps the trace, flags and tracestate and replaces the parent id")
    func continued() throws {
        let context = try #require(
            TraceContext(traceparent: Array(Self.example.utf8), tracestate: Array("congo=t61rcWkgMzE".utf8)))
        let next = context.continued(from: 0x1122_3344_5566_7788)
        #expect(next.traceparent == "00-4bf92f3577b34da6a3ce929d0e0e4736-1122334455667788-01")
        #expect(next.traceState == "congo=t61rcWkgMzE")
    }
}
