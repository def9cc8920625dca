import Foundation
import Testing

/// heraldctl's `--traceparent` on registry writes (docs/heraldctl.md): a value that is not a W3C `traceparent`, one
/// without `--via-kafka`, or a `--tracestate` alone is a usage error before anything is written.
@Suite("heraldctl --traceparent (CLI contract)")
struct HeraldctlTraceCLITests {
    static let token = String(repeating: "ab", count: 32)
    static let valid = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    func register(_ extra: [String]) async throws -> SimulateCLITests.Run {
        // A Redis and a broker nobody listens on: a command that got past its options would fail on them instead.
        try await SimulateCLITests().heraldctl(
            [
                "device", "register", "--app", "app1", "--user", "u1", "--token", Self.token, "--redis",
                "redis://127.0.0.1:1",
                "--brokers", "127.0.0.1:1",
            ] + extra)
    }

    @Test(arguments: [
        (["--via-kafka", "--traceparent", "garbage"], "traceparent"),
        (["--via-kafka", "--traceparent", "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"], "traceparent"),
        (["--traceparent", valid], "--via-kafka"),
        (["--via-kafka", "--tracestate", "vendor=x"], "--traceparent"),
    ])
    func refused(extra: [String], says: String) async throws {
        let r = try await register(extra)
        #expect(r.status == 64, "status \(r.status): \(r.stderr)")
        #expect(r.stderr.contains(says), "\(r.stderr)")
    }
}
