import Foundation
import Prometheus
import Testing

@testable import HeraldStage

#if canImport(Glibc)
import Glibc
#endif

@Suite("Process metrics on /metrics")
struct ProcessMetricsTests {
    @Test("a /proc/<pid>/stat line is read past a command name holding spaces and parentheses")
    func parsesStat() throws {
        // Fields 3 to 24 of proc(5): state, ..., utime (14) 250, stime (15) 150, starttime (22) 1000,
        // vsize (23) 300000000, rss (24) 2560 pages.
        var fields = ["S"] + Array(repeating: "0", count: 21)
        fields[14 - 3] = "250"
        fields[15 - 3] = "150"
        fields[22 - 3] = "1000"
        fields[23 - 3] = "300000000"
        fields[24 - 3] = "2560"
        let stat = "4242 (herald (send) x) " + fields.joined(separator: " ") + " 0 0 0\n"
        let parsed = try #require(
            ProcessMetrics.parse(
                stat: stat, bootTime: 1_700_000_000, openFileDescriptors: 12, maxFileDescriptors: 1024,
                ticksPerSecond: 100, pageSize: 4096))
        #expect(
            parsed
                == ProcessMetrics(
                    cpuSeconds: 4, residentBytes: 2560 * 4096, virtualBytes: 300_000_000,
                    startTimeSeconds: 1_700_000_010, openFileDescriptors: 12, maxFileDescriptors: 1024))
        #expect(
            ProcessMetrics.parse(
                stat: "4242 (short) S 1 2", bootTime: 0, openFileDescriptors: 0, maxFileDescriptors: 0,
                ticksPerSecond: 100, pageSize: 4096) == nil)
        #expect(
            ProcessMetrics.parse(
                stat: "no parenthesis", bootTime: 0, openFileDescriptors: 0, maxFileDescriptors: 0,
                ticksPerSecond: 100, pageSize: 4096) == nil)
    }

    @Test(
        "a scrape gives this process's CPU, memory, start time and descriptors, with the stage's label, as they change")
    func scrapeFollowsTheProcess() async throws {
        let registry = PrometheusCollectorRegistry()
        let server = try await StageHTTPServer.bind(
            host: "127.0.0.1", port: 0, registry: registry, readiness: ReadinessChecks(),
            readinessLabels: [("stage", "render")])
        let serving = Task { try await server.run() }
        defer { serving.cancel() }

        let before = try await Self.scrape(server.port)
        for family in ProcessMetrics.families {
            #expect(before[family.name] != nil, "\(family.name) missing")
        }
        let status = try String(contentsOfFile: "/proc/self/status", encoding: .utf8)
        let peakKB = try #require(
            status.split(separator: "\n").first { $0.hasPrefix("VmPeak:") }?
                .split(whereSeparator: { $0 == " " || $0 == "\t" }).dropFirst().first.flatMap { Double($0) })
        let resident = try #require(before["process_resident_memory_bytes"])
        #expect(resident > 1_000_000 && resident <= peakKB * 1024, "\(resident) bytes")
        let start = try #require(before["process_start_time_seconds"])
        #expect(start <= Date().timeIntervalSince1970 && start > Date().timeIntervalSince1970 - 86_400)
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        #expect(before["process_max_fds"] == Double(limit.rlim_cur))

        // CPU: spin until this process used 0.3 s more (as getrusage counts it), then the counter shows it.
        let spent = Self.cpuSeconds()
        var sink: UInt64 = 0
        while Self.cpuSeconds() - spent < 0.3 {
            for i in 0..<100_000 { sink = sink &* 31 &+ UInt64(i) }
        }
        #expect(sink != 1)
        // Descriptors: 16 pipes, 32 open while the scrape counts.
        var pipes: [Int32] = []
        for _ in 0..<16 {
            var fds: [Int32] = [0, 0]
            try #require(pipe(&fds) == 0)
            pipes += fds
        }
        defer { pipes.forEach { close($0) } }
        let after = try await Self.scrape(server.port)
        let cpu = try #require(after["process_cpu_seconds_total"]) - (before["process_cpu_seconds_total"] ?? 0)
        #expect(cpu >= 0.25, "CPU went up by \(cpu) s")
        // Other tests of the process open and close descriptors meanwhile, so the count is only known to hold the
        // 32 pipe ends and standard input, output and error.
        let fds = try #require(after["process_open_fds"])
        #expect(fds >= 35, "\(fds) open descriptors")
    }

    /// The process families' values from a scrape, keyed by name; only series labelled `stage="render"`.
    static func scrape(_ port: Int) async throws -> [String: Double] {
        let answer = try await RawHTTP.get(port: port, path: "/metrics")
        var values: [String: Double] = [:]
        for line in answer.body.split(separator: "\n") where line.hasPrefix("process_") {
            let parts = line.split(separator: " ")
            guard parts.count == 2, parts[0].hasSuffix(#"{stage="render"}"#) else { continue }
            values[String(parts[0].prefix { $0 != "{" })] = Double(parts[1])
        }
        return values
    }

    static func cpuSeconds() -> Double {
        var usage = rusage()
        getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage)
        return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec)
            + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1_000_000
    }
}
