// A registry API write with a W3C `traceparent` (and `tracestate`) header publishes its `herald.registry` record
// with the context (docs/operations.md "Tracing"), so herald-registry continues the caller's trace; a malformed
// header is ignored, never an error. Without a server: the sink records what it was given.
import Foundation
import HeraldCore
import HeraldKafka
import HeraldRedis
import HeraldRegistryAPI
import HeraldTestSupport
import Logging
import Synchronization
import Testing

@Suite("Registry API: trace context")
struct RegistryTraceTests {
    final class Sink: RegistryRecordSink {
        let published = Mutex<[(RegistryRecord, RegistryTrace?)]>([])
        func publish(_ record: RegistryRecord) async throws { try await publish(record, trace: nil) }
        func publish(_ record: RegistryRecord, trace: RegistryTrace?) async throws {
            published.withLock { $0.append((record, trace)) }
        }
        var traces: [RegistryTrace?] { published.withLock { $0.map(\.1) } }
    }

    static let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    static func api(_ sink: Sink) throws -> RegistryAPI {
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        let connection = RedisConnection(
            configuration: try RedisConfiguration(url: "redis://127.0.0.1:1"), logger: logger)
        return RegistryAPI(
            operations: RegistryOperations(
                sink: sink, store: StateStore(connection: connection, logger: logger),
                explain: ExplainStore(connection: connection)),
            clients: [RegistryAPI.Client(name: "all", token: WebPushRegistrationTests.token)], logger: logger,
            apps: AppDirectory(apps: ["app1": AppConfig(appID: "app1")], listedOnly: true))
    }

    /// A device registration with `headers` besides the bearer token; its status.
    static func register(_ api: RegistryAPI, _ headers: [String: String]) async -> Int {
        let body = #"{"token":"\#(String(repeating: "ab", count: 32))","bundle_id":"com.example.chat"}"#
        let response = await api.handle(
            method: "POST", path: "/v1/apps/app1/users/u1/devices",
            headers: headers.merging(["authorization": "Bearer \(WebPushRegistrationTests.token)"]) { a, _ in a },
            body: Array(body.utf8))
        return response.status
    }

    @Test("a valid traceparent and tracestate go on with the record")
    func valid() async throws {
        let sink = Sink()
        let api = try Self.api(sink)
        #expect(
            await Self.register(api, ["traceparent": Self.traceparent, "tracestate": "vendor=x,other=y"]) == 202)
        let trace = try #require(sink.traces.first ?? nil)
        #expect(trace.traceparent == Self.traceparent && trace.tracestate == "vendor=x,other=y")
        #expect(
            trace.headers == [
                KafkaHeader(key: "traceparent", string: Self.traceparent),
                KafkaHeader(key: "tracestate", string: "vendor=x,other=y"),
            ])
        // The sampled flag is passed on as it came (herald-registry's sampler keeps it).
        #expect(
            await Self.register(api, ["traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"]) == 202)
        #expect(sink.traces.last??.traceparent.hasSuffix("-00") == true)
        #expect(sink.traces.last??.tracestate == nil && sink.traces.last??.headers.count == 1)
    }

    @Test(arguments: [
        "", "garbage", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
    ])
    func malformedIsIgnored(traceparent: String) async throws {
        let sink = Sink()
        let api = try Self.api(sink)
        #expect(await Self.register(api, ["traceparent": traceparent, "tracestate": "vendor=x"]) == 202)
        #expect(sink.published.withLock { $0.count } == 1)
        #expect(sink.traces == [nil])
    }

    @Test("no header: no context; a malformed tracestate is dropped, the traceparent kept")
    func withoutOrBadState() async throws {
        let sink = Sink()
        let api = try Self.api(sink)
        #expect(await Self.register(api, [:]) == 202)
        #expect(await Self.register(api, ["traceparent": Self.traceparent, "tracestate": "no equals sign"]) == 202)
        #expect(sink.traces.count == 2 && sink.traces[0] == nil)
        #expect(sink.traces[1]?.traceparent == Self.traceparent && sink.traces[1]?.tracestate == nil)
    }
}

extension RegistryAPITests {
    @Test("over HTTP: a write with a traceparent header puts it on its herald.registry record; one without has none")
    func traceparentReachesTheTopic() async throws {
        let s = try APIStackHolder.stack()
        let traceparent = RegistryTraceTests.traceparent
        let register = #"{"token": "\#(APIStack.hex(77))", "bundle_id": "com.example.chat"}"#
        let traced = try await TestHTTP.request(
            port: s.apiPort, method: "POST", path: "/v1/apps/app1/users/u-traced/devices",
            headers: [
                "Authorization": "Bearer \(APIStack.token)", "traceparent": traceparent, "tracestate": "vendor=x",
            ], body: register)
        #expect(traced.status == 202)
        let malformed = try await TestHTTP.request(
            port: s.apiPort, method: "POST", path: "/v1/apps/app1/users/u-malformed/devices",
            headers: ["Authorization": "Bearer \(APIStack.token)", "traceparent": "00-not-a-context-01"],
            body: #"{"token": "\#(APIStack.hex(78))", "bundle_id": "com.example.chat"}"#)
        #expect(malformed.status == 202)
        // Read herald.registry from the start with a group of its own until both records are there.
        var configuration = KafkaConsumerConfiguration(
            brokers: s.tansu.brokers, groupID: "trace-reader-\(UUID())", topics: ["herald.registry"])
        configuration.sessionTimeout = .seconds(3)
        let consumer = try KafkaConsumer(configuration: configuration)
        var byUser: [String: ConsumerRecord] = [:]
        let deadline = ContinuousClock.now + .seconds(120)
        while byUser["u-traced"] == nil || byUser["u-malformed"] == nil, ContinuousClock.now < deadline {
            for record in try await consumer.nextBatch() ?? [] {
                if let key = record.key { byUser[String(decoding: key, as: UTF8.self)] = record }
            }
        }
        await consumer.shutdown()
        let headers = try #require(byUser["u-traced"]).headers
        #expect(headers.first { $0.key == "traceparent" }?.value == Array(traceparent.utf8))
        #expect(headers.first { $0.key == "tracestate" }?.value == Array("vendor=x".utf8))
        #expect(try #require(byUser["u-malformed"]).headers.allSatisfy { !$0.key.hasPrefix("trace") })
    }
}
