// herald-bench redis-callers: many concurrent callers on one RedisConnection, as send's concurrent batches claim and
// confirm on one connection and resolve's reads share one, with Redis a round trip away. A relay in this process
// holds every chunk for half the round trip in each direction, so loopback behaves like a network hop; the bench
// starts its own redis-server. It prints calls and commands per second and each call's p50 / p99.

import ArgumentParser
import Foundation
import HeraldBenchSupport
import HeraldCore
import HeraldRedis
import Synchronization

struct RedisCallersBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "redis-callers",
        abstract: "Concurrent callers on one Redis connection across an injected round trip: calls/s and latency.")

    @Option(help: "Concurrent callers (send runs up to 64 batches at once per lane).") var callers = 64
    @Option(help: "Commands per call (HSETNX, one per claim of a send batch).") var commands = 30
    @Option(help: "Round-trip times to inject, in milliseconds, comma separated (0: straight to Redis).")
    var rttMs = "0,0.5,2"
    @Option(help: "Seconds per round-trip time.") var seconds = 3.0

    func run() async throws {
        let port = freePort()
        let server = Process()
        server.executableURL = URL(fileURLWithPath: "/usr/bin/redis-server")
        server.arguments = ["--port", "\(port)", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        server.standardOutput = FileHandle.nullDevice
        try server.run()
        defer {
            kill(server.processIdentifier, SIGKILL)
            server.waitUntilExit()
        }
        let direct = RedisConnection(configuration: RedisConfiguration(host: "127.0.0.1", port: port))
        defer { direct.close() }
        var up = false
        for _ in 0..<200 where !up {
            up = await direct.ping()
            if !up { try await Task.sleep(for: .milliseconds(25)) }
        }
        guard up else { throw BenchError("redis-server on port \(port) did not answer") }

        print("herald-bench redis-callers: \(callers) callers on one connection, \(commands) HSETNX per call")
        print("| injected round trip | calls/s | commands/s | call p50 | call p99 |")
        print("| --- | --- | --- | --- | --- |")
        for rtt in rttMs.split(separator: ",").compactMap({ Double($0.trimmingCharacters(in: .whitespaces)) }) {
            var target = port
            var relay: DelayRelay?
            if rtt > 0 {
                let made = try DelayRelay(to: port, oneWay: .microseconds(Int64(rtt * 500)))
                relay = made
                target = made.port
            }
            let connection = RedisConnection(configuration: RedisConfiguration(host: "127.0.0.1", port: target))
            try await connection.connect()
            let figures = try await measure(connection)
            connection.close()
            relay?.stop()
            print(
                String(
                    format: "| %.1f ms | %.0f | %.0f | %.2f ms | %.2f ms |", rtt, figures.callsPerSecond,
                    figures.callsPerSecond * Double(commands), figures.p50, figures.p99))
        }
    }

    private func measure(
        _ connection: RedisConnection
    ) async throws -> (callsPerSecond: Double, p50: Double, p99: Double) {
        let deadline = ContinuousClock.now + .milliseconds(Int64(seconds * 1000))
        let started = ContinuousClock.now
        let perCaller = try await withThrowingTaskGroup(of: [Double].self) { group in
            for caller in 0..<callers {
                group.addTask {
                    var latencies: [Double] = []
                    var round = 0
                    while ContinuousClock.now < deadline {
                        var batch = RedisBatch(capacity: commands * 64)
                        for index in 0..<commands {
                            batch.command("HSETNX", arguments: 3)
                            batch.argument("bench:claims:\(caller % 16)")
                            batch.argument("\(caller):\(round):\(index)")
                            batch.argument("1")
                        }
                        let sent = ContinuousClock.now
                        let replies = try await connection.pipeline(batch)
                        guard replies.count == commands else { throw BenchError("\(replies.count) replies") }
                        latencies.append((ContinuousClock.now - sent).timeInterval * 1000)
                        round += 1
                    }
                    return latencies
                }
            }
            var all: [[Double]] = []
            for try await latencies in group { all.append(latencies) }
            return all
        }
        let elapsed = (ContinuousClock.now - started).timeInterval
        let latencies = perCaller.flatMap { $0 }.sorted()
        guard !latencies.isEmpty else { return (0, 0, 0) }
        func quantile(_ q: Double) -> Double { latencies[min(latencies.count - 1, Int(Double(latencies.count) * q))] }
        return (Double(latencies.count) / elapsed, quantile(0.5), quantile(0.99))
    }
}

/// A TCP relay on loopback that holds every chunk for `oneWay` before passing it on, in both directions: a
/// network hop of twice that round trip between a client and a server on the same host.
final class DelayRelay: @unchecked Sendable {
    let port: Int
    private let listener: Int32
    private let target: Int
    private let oneWay: Duration
    private let stopped = Atomic<Bool>(false)

    init(to target: Int, oneWay: Duration) throws {
        self.target = target
        self.oneWay = oneWay
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var yes: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        var address = Self.loopback(0)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(fd, 64) == 0 else { throw BenchError("relay: bind/listen failed") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        port = Int(UInt16(bigEndian: address.sin_port))
        listener = fd
        let thread = Thread { [self] in self.acceptLoop() }
        thread.start()
    }

    func stop() {
        stopped.store(true, ordering: .relaxed)
        shutdown(listener, Int32(SHUT_RDWR))
    }

    private static func loopback(_ port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(port).bigEndian
        return address
    }

    private func acceptLoop() {
        while !stopped.load(ordering: .relaxed) {
            let client = accept(listener, nil, nil)
            if client < 0 { break }
            let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = Self.loopback(target)
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            guard connected == 0 else {
                close(client)
                close(server)
                continue
            }
            var yes: Int32 = 1
            for fd in [client, server] {
                setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &yes, socklen_t(MemoryLayout<Int32>.size))
            }
            let up = DelayedPipe(from: client, to: server, delay: oneWay)
            let down = DelayedPipe(from: server, to: client, delay: oneWay)
            up.start()
            down.start()
        }
        close(listener)
    }
}

/// One direction of the relay: a reader thread stamps each chunk, a writer thread sends it once it is due.
private final class DelayedPipe: @unchecked Sendable {
    private let from: Int32
    private let to: Int32
    private let delay: Duration
    private let condition = NSCondition()
    private var chunks: [(due: ContinuousClock.Instant, bytes: [UInt8])] = []
    private var ended = false

    init(from: Int32, to: Int32, delay: Duration) {
        self.from = from
        self.to = to
        self.delay = delay
    }

    func start() {
        Thread { [self] in self.read() }.start()
        Thread { [self] in self.write() }.start()
    }

    private func read() {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = Glibc.read(from, &buffer, buffer.count)
            condition.lock()
            if n <= 0 {
                ended = true
            } else {
                chunks.append((ContinuousClock.now + delay, Array(buffer[0..<n])))
            }
            condition.signal()
            condition.unlock()
            if n <= 0 { return }
        }
    }

    private func write() {
        while true {
            condition.lock()
            while chunks.isEmpty && !ended { condition.wait() }
            if chunks.isEmpty {
                condition.unlock()
                shutdown(to, Int32(SHUT_WR))
                return
            }
            let chunk = chunks.removeFirst()
            condition.unlock()
            let wait = chunk.due - .now
            if wait > .zero { Thread.sleep(forTimeInterval: wait.timeInterval) }
            var sent = 0
            while sent < chunk.bytes.count {
                let n = chunk.bytes[sent...].withUnsafeBytes { Glibc.write(to, $0.baseAddress, $0.count) }
                if n <= 0 { return }
                sent += n
            }
        }
    }
}
