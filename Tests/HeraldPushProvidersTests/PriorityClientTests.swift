// Prioritized requests (the priority lane's calls and direct messages) against herald-mock-apns: started before
// queued bulk requests, on streams and in-flight slots a bulk batch cannot take.
import Foundation
import HeraldCore
import HeraldPushProviders
import HeraldTestSupport
import Synchronization
import Testing

@Suite(.serialized)
struct PriorityClientTests {
    func reservingClient(
        _ pki: PKI, port: Int, reserve: Double, priorityConnections: Int = 0, maxInFlight: Int = 100
    ) throws -> APNsClient {
        var config = APNsClientConfiguration(
            credential: try pki.tokenCredential(), environment: .sandbox,
            endpoint: ServiceEndpoint(host: "127.0.0.1", port: port), trustedCAFile: pki.serverCert,
            connections: 1, maxStreamsPerConnection: 10, maxInFlight: maxInFlight,
            reconnectBackoff: BackoffPolicy(initialDelay: .milliseconds(20), maxDelay: .milliseconds(500)))
        config.priorityReserve = reserve
        config.priorityConnections = priorityConnections
        return try APNsClient(configuration: config)
    }

    /// Sends a bulk request, then prioritized ones until one is answered on the connection kept for them: both
    /// connections are then open and past the server's SETTINGS (10 streams each here). Before that a prioritized
    /// request goes on the shared connection, as it should, and a connection that has not read the server's
    /// SETTINGS yet takes one stream at a time; on a busy machine the second connection can take that long.
    func warmUp(_ c: APNsClient) async throws {
        #expect(await c.send(request(999)).status == 200)
        for tag in 2000..<2400 where c.stats.streamsOnPriorityConnections == 0 {
            var warm = request(tag)
            warm.prioritized = true
            #expect(await c.send(warm).status == 200)
            if c.stats.streamsOnPriorityConnections == 0 { try await Task.sleep(for: .milliseconds(50)) }
        }
        try #require(c.stats.streamsOnPriorityConnections > 0, "the connection for prioritized requests took none")
    }

    /// Sends `urgent` and returns its status and how many bulk requests had been answered when its answer came, both
    /// read on the client's I/O thread as the answer arrives: how long the test's own task then waits for a thread
    /// (seconds, on a loaded 2-core machine running the suites in parallel) does not count.
    func sendCounting(
        _ urgent: PushDelivery, on c: APNsClient, against bulkDone: TestCount
    ) async throws -> (Int?, Int) {
        let seen = Mutex<(Int?, Int)?>(nil)
        await c.submit([urgent]) { r in
            let done = bulkDone.value
            seen.withLock { $0 = (r.status, done) }
        }
        try await waitUntil("the prioritized request answered", timeout: .seconds(120)) {
            seen.withLock { $0 != nil }
        }
        return seen.withLock { $0 } ?? (nil, -1)
    }

    @Test func aPrioritizedRequestOvertakesAQueuedBulkBatch() async throws {
        let pki = try await PKI.make()
        // A long answer latency (400 ms a round of 8 streams) keeps the check about order, not speed: on a loaded
        // 2-core machine the test task itself may wait a second for a thread, which at 100 ms a round let the bulk
        // batch finish before the prioritized request was even submitted.
        let server = try await startMock(pki, ["--latency-ms", "400"])
        defer { server.stop() }
        let c = try reservingClient(pki, port: server.port, reserve: 0.2)
        // Warm up: the connection starts at one stream until the server's settings arrive.
        #expect(await c.send(request(999)).status == 200)

        let bulkDone = TestCount()
        let bulk = Task {
            await c.submit((0..<100).map { request($0) }) { r in
                #expect(r.status == 200)
                bulkDone.add(1)
            }
        }
        // The bulk batch takes at most 80 of the 100 slots and 8 of the 10 streams; the rest wait.
        try await waitUntil("bulk requests accepted", timeout: .seconds(60)) { c.stats.submitted >= 81 }
        #expect(c.stats.submitted - c.stats.completed <= 81, "bulk stayed out of the reserved slots")

        var urgent = request(500)
        urgent.prioritized = true
        let (status, bulkAtUrgent) = try await sendCounting(urgent, on: c, against: bulkDone)
        #expect(status == 200)
        // Without priority it would wait for the 80 queued ahead of it (10 rounds of 400 ms on 8 streams); with the
        // reserved streams it is answered in the first round after it was submitted.
        #expect(bulkAtUrgent < 60, "the prioritized request finished after \(bulkAtUrgent) of 100 bulk requests")
        await bulk.value
        try await waitUntil("every bulk request answered", timeout: .seconds(120)) { bulkDone.value == 100 }
        await c.shutdown()
    }

    /// A connection kept for prioritized requests: a call is written on it, never queued behind a bulk batch for a
    /// stream of the shared connection (no reserved streams there), and bulk requests never use it.
    @Test func aConnectionOfItsOwnForPrioritizedRequests() async throws {
        let pki = try await PKI.make()
        let server = try await startMock(pki, ["--latency-ms", "400"])
        defer { server.stop() }
        let c = try reservingClient(pki, port: server.port, reserve: 0, priorityConnections: 1, maxInFlight: 1000)
        try await warmUp(c)
        #expect(c.stats.connectionsOpened == 2, "one shared connection and one for prioritized requests")
        let (onPriority, opened, submitted) = (
            c.stats.streamsOnPriorityConnections, c.stats.streamsOpened, c.stats.submitted
        )

        let bulkDone = TestCount()
        await c.submit((0..<100).map { request($0) }) { r in
            #expect(r.status == 200)
            bulkDone.add(1)
        }
        try await waitUntil("bulk requests accepted", timeout: .seconds(60)) { c.stats.submitted >= submitted + 100 }

        var urgent = request(500)
        urgent.prioritized = true
        let (status, bulkAtUrgent) = try await sendCounting(urgent, on: c, against: bulkDone)
        #expect(status == 200)
        #expect(bulkAtUrgent < 60, "the prioritized request finished after \(bulkAtUrgent) of 100 bulk requests")
        try await waitUntil("every bulk request answered", timeout: .seconds(120)) { bulkDone.value == 100 }
        // The call went on the dedicated connection; none of the 100 bulk requests did, though the shared
        // connection's 10 streams kept 90 of them waiting.
        #expect(c.stats.streamsOnPriorityConnections == onPriority + 1)
        #expect(c.stats.streamsOpened == opened + 101)
        await c.shutdown()
    }

    /// One batch that mixes prioritized and bulk requests: the prioritized ones are accepted first and written on the
    /// connection kept for them, the bulk ones on the shared connection; every request is answered once and counted.
    @Test func aMixedBatchWritesItsPrioritizedRequestsOnTheirConnection() async throws {
        let pki = try await PKI.make()
        let server = try await startMock(pki)
        defer { server.stop() }
        let c = try reservingClient(pki, port: server.port, reserve: 0, priorityConnections: 1, maxInFlight: 1000)
        try await warmUp(c)
        let (onPriority, opened) = (c.stats.streamsOnPriorityConnections, c.stats.streamsOpened)

        let batch = (0..<60).map { i in
            var r = request(i)
            r.prioritized = i % 6 == 0
            return r
        }
        let answers = Mutex<[UInt64: [Int?]]>([:])
        await c.submit(batch) { r in answers.withLock { $0[r.tag, default: []].append(r.status) } }
        try await waitUntil("every request of the batch answered", timeout: .seconds(120)) {
            answers.withLock { $0.values.reduce(0) { $0 + $1.count } } == 60
        }
        #expect(answers.withLock { $0 } == Dictionary(uniqueKeysWithValues: batch.map { ($0.tag, [200]) }))
        // The ten prioritized requests fit the dedicated connection's ten streams; no bulk request went there.
        #expect(c.stats.streamsOnPriorityConnections == onPriority + 10)
        #expect(c.stats.streamsOpened == opened + 60)
        #expect(c.stats.answersByStatus == [200: opened + 60])
        await c.shutdown()
    }

    /// Without a dedicated connection, prioritized requests share the others (and their reserved streams).
    @Test func noDedicatedConnectionUnlessConfigured() async throws {
        let pki = try await PKI.make()
        let server = try await startMock(pki)
        defer { server.stop() }
        let c = try reservingClient(pki, port: server.port, reserve: 0.2)
        var urgent = request(1)
        urgent.prioritized = true
        #expect(await c.send(urgent).status == 200)
        #expect(c.stats.connectionsOpened == 1)
        #expect(c.stats.streamsOnPriorityConnections == 0)
        await c.shutdown()
    }
}
