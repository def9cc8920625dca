import Foundation
import HeraldRedis
import HeraldTestSupport
import Synchronization
import Testing

/// The channels a subscriber heard, in order.
private final class Heard: Sendable {
    private let channels = Mutex<[String]>([])
    func add(_ channel: String) { channels.withLock { $0.append(channel) } }
    var all: [String] { channels.withLock { $0 } }
}

@Suite("RedisSubscriber against a real redis-server")
struct RedisSubscriberTests {
    @Test("messages on its channels reach the handler; other channels do not; stop ends the subscription")
    func hearsItsChannels() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let heard = Heard()
        let subscriber = RedisSubscriber(configuration: server.configuration, channels: ["bell:a", "bell:b"]) {
            heard.add($0)
        }
        subscriber.start()
        try await waitUntil("subscribed", timeout: .seconds(60)) {
            try await redis.send("PUBSUB", "NUMSUB", "bell:a").array?.last?.int == 1
        }
        #expect(subscriber.isSubscribed)
        #expect(try await redis.send("PUBLISH", "bell:a", "").int == 1)
        #expect(try await redis.send("PUBLISH", "bell:other", "").int == 0)
        #expect(try await redis.send("PUBLISH", "bell:b", "x").int == 1)
        try await waitUntil("both messages heard", timeout: .seconds(60)) { heard.all.count == 2 }
        #expect(heard.all == ["bell:a", "bell:b"])

        subscriber.stop()
        try await waitUntil("unsubscribed", timeout: .seconds(60)) {
            try await redis.send("PUBSUB", "NUMSUB", "bell:a").array?.last?.int == 0
        }
        #expect(try await redis.send("PUBLISH", "bell:a", "").int == 0)
    }

    @Test("a connection the server drops is opened and subscribed again; while silent it sends keep-alive PINGs")
    func resubscribesAfterADrop() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let heard = Heard()
        let subscriber = RedisSubscriber(
            configuration: server.configuration, channels: ["bell:a"], keepAliveInterval: .milliseconds(200)
        ) { heard.add($0) }
        subscriber.start()
        defer { subscriber.stop() }
        let subscribed = { try await redis.send("PUBSUB", "NUMSUB", "bell:a").array?.last?.int == 1 }
        try await waitUntil("subscribed", timeout: .seconds(60), subscribed)

        // The server closes the subscriber's connection: it comes back and hears the next message.
        _ = try await redis.send("CLIENT", "KILL", "TYPE", "pubsub")
        try await waitUntil("subscribed again", timeout: .seconds(60)) {
            try await redis.send("PUBLISH", "bell:a", "").int == 1
        }
        try await waitUntil("a message heard after the drop", timeout: .seconds(60)) { !heard.all.isEmpty }

        // Keep-alive intervals of silence: PINGs are sent and answered, the subscription stays.
        try await waitUntil("keep-alive PINGs answered", timeout: .seconds(60)) {
            let clients = try await redis.send("CLIENT", "LIST", "TYPE", "pubsub").text ?? ""
            // `cmd=ping` once the subscriber's last command was its keep-alive.
            return clients.contains("cmd=ping")
        }
        #expect(try await redis.send("PUBSUB", "NUMSUB", "bell:a").array?.last?.int == 1)
    }

    @Test("a message past the size bound is not read whole: the subscriber reconnects and hears the next one")
    func oversizedMessageIsNotBuffered() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let heard = Heard()
        let subscriber = RedisSubscriber(configuration: server.configuration, channels: ["bell:a"]) { heard.add($0) }
        subscriber.start()
        defer { subscriber.stop() }
        let subscribed = { try await redis.send("PUBSUB", "NUMSUB", "bell:a").array?.last?.int == 1 }
        try await waitUntil("subscribed", timeout: .seconds(60), subscribed)
        let clientID = { try await redis.send("CLIENT", "LIST", "TYPE", "pubsub").text ?? "" }
        let before = try await clientID()
        let huge = String(repeating: "x", count: 8 * RedisSubscriber.maxMessageBytes)
        #expect(try await redis.send("PUBLISH", "bell:a", huge).int == 1)
        // The subscriber dropped that connection and made a new one (another client id), without the message.
        try await waitUntil("subscribed on a new connection", timeout: .seconds(60)) {
            let now = try await clientID()
            return now.contains("sub=1") && now.split(separator: " ").first != before.split(separator: " ").first
        }
        #expect(heard.all.isEmpty, "the oversized message reached the handler")
        try await waitUntil("the next message heard", timeout: .seconds(60)) {
            _ = try await redis.send("PUBLISH", "bell:a", "")
            return heard.all == ["bell:a"] || heard.all.count >= 1
        }
        #expect(heard.all.allSatisfy { $0 == "bell:a" })
    }
}
