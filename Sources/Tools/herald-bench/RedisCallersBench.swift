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
