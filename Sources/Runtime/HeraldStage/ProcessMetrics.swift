import Foundation
import HeraldCore

#if canImport(Glibc)
import Glibc
#endif

/// The process's own figures in the names every Prometheus client library exports (`process_cpu_seconds_total`,
/// `process_resident_memory_bytes`, ...), read from /proc at each scrape of `/metrics` and labelled like the
/// stage's other series. With them a fleet's owner sees, per stage and per pod, the CPU and memory the stage
/// costs, and divides by the notifications delivered (`herald:cpu_seconds_per_delivered:rate5m`,
/// deploy/prometheus/alerts.yml) to get the cost of a notification in production.
public struct ProcessMetrics: Sendable, Equatable {
    /// User and system CPU time, in seconds.
    public var cpuSeconds: Double
    public var residentBytes: Int
    public var virtualBytes: Int
    /// When the process started, in seconds since the Unix epoch.
    public var startTimeSeconds: Double
    public var openFileDescriptors: Int
    /// The soft limit on open file descriptors.
    public var maxFileDescriptors: Int

    /// The families, in the order they are written: name, type, and the docs table's meaning.
    public static let families: [(name: String, type: String, meaning: String)] = [
        ("process_cpu_seconds_total", "counter", "CPU time the process used, user and system, in seconds"),
        ("process_resident_memory_bytes", "gauge", "resident memory"),
        ("process_virtual_memory_bytes", "gauge", "virtual memory"),
        ("process_start_time_seconds", "gauge", "when the process started, seconds since the Unix epoch"),
        ("process_open_fds", "gauge", "open file descriptors (sockets included)"),
        ("process_max_fds", "gauge", "the limit on open file descriptors (`ulimit -n`)"),
    ]

    /// This process's figures now; nil where /proc cannot be read (not Linux).
    public static func current() -> ProcessMetrics? {
        guard let stat = try? String(contentsOfFile: "/proc/self/stat", encoding: .utf8) else { return nil }
        return parse(
            stat: stat, bootTime: bootTime, openFileDescriptors: openFileDescriptorCount(),
            maxFileDescriptors: maxFileDescriptorLimit(), ticksPerSecond: Double(sysconf(Int32(_SC_CLK_TCK))),
            pageSize: Int(sysconf(Int32(_SC_PAGESIZE))))
    }

    /// The figures from the text of /proc/<pid>/stat (`ProcStat`); nil when it is not in that form.
    public static func parse(
        stat: String, bootTime: Double, openFileDescriptors: Int, maxFileDescriptors: Int, ticksPerSecond: Double,
        pageSize: Int
    ) -> ProcessMetrics? {
        guard ticksPerSecond > 0, let fields = ProcStat(stat), let cpu = fields.cpuTicks,
            let start = fields.number(22), let vsize = fields.number(23), let rss = fields.number(24)
        else { return nil }
        return ProcessMetrics(
            cpuSeconds: cpu / ticksPerSecond, residentBytes: Int(rss) * pageSize,
            virtualBytes: Int(vsize), startTimeSeconds: bootTime + start / ticksPerSecond,
            openFileDescriptors: openFileDescriptors, maxFileDescriptors: maxFileDescriptors)
    }

    /// Appends the families in the Prometheus text format, each series with `labels`.
    public func emit(labels: [(String, String)], into buffer: inout [UInt8]) {
        let values: [String] = [
            Self.format(cpuSeconds), String(residentBytes), String(virtualBytes), Self.format(startTimeSeconds),
            String(openFileDescriptors), String(maxFileDescriptors),
        ]
        let labelText =
            labels.isEmpty
            ? "" : "{" + labels.map { "\($0.0)=\"\(StageMetrics.labelValue($0.1))\"" }.joined(separator: ",") + "}"
        for (family, value) in zip(Self.families, values) {
            buffer.append(
                contentsOf: "# TYPE \(family.name) \(family.type)\n\(family.name)\(labelText) \(value)\n".utf8)
        }
    }

    private static func format(_ value: Double) -> String { String(format: "%.2f", value) }

    /// The system's boot time, seconds since the epoch (`btime` of /proc/stat), read once.
    static let bootTime: Double = {
        guard let text = try? String(contentsOfFile: "/proc/stat", encoding: .utf8) else { return 0 }
        for line in text.split(separator: "\n") where line.hasPrefix("btime ") {
            return Double(line.dropFirst(6).trimmingCharacters(in: .whitespaces)) ?? 0
        }
        return 0
    }()

    static func openFileDescriptorCount() -> Int {
        // The listing's own descriptor is among them, as in other clients' counts. The entries are counted as
        // readdir(3) returns them, without a string per descriptor.
        guard let directory = opendir("/proc/self/fd") else { return 0 }
        defer { closedir(directory) }
        var count = 0
        // The name is read in place, byte by byte up to its NUL: readdir's entry is only as long as its name
        // (`d_reclen`), so copying the whole `dirent` (256 bytes of `d_name`) would read past its end.
        let nameOffset = MemoryLayout<dirent>.offset(of: \dirent.d_name) ?? 19
        while let entry = readdir(directory) {
            let name = UnsafeRawPointer(entry).advanced(by: nameOffset).assumingMemoryBound(to: UInt8.self)
            let isDotOrDotDot = name[0] == 46 && (name[1] == 0 || (name[1] == 46 && name[2] == 0))
            if !isDotOrDotDot { count += 1 }
        }
        return count
    }

    static func maxFileDescriptorLimit() -> Int {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 0 }
        return limit.rlim_cur == rlim_t.max ? Int.max : Int(clamping: limit.rlim_cur)
    }
}
