import Foundation
import HeraldCore
import HeraldKafka
import HeraldRegistryAPI

/// A registry change an operator asks for with `--via-kafka`.
enum RegistryUpdate {
    case register(app: String, user: String, device: Device, unique: Bool = false)
    case unregister(app: String, user: String, token: String)
    case unregisterAll(app: String, user: String)
    case preferences(app: String, user: String, preferences: Preferences)
    case presence(app: String, user: String, online: [String], ttlMilliseconds: Int64)
    case patch(app: String, user: String, patch: PreferencePatch)
    case markRead(app: String, user: String, conversation: String?, token: String? = nil)

    /// The `herald.registry` record (docs/pipeline.md) herald-registry applies.
    var record: RegistryRecord {
        switch self {
        case .register(let app, let user, let device, let unique):
            return RegistryRecord(
                op: .registerDevice, appID: app, user: user, device: device, unique: unique ? true : nil)
        case .unregister(let app, let user, let token):
            return RegistryRecord(op: .unregisterDevice, appID: app, user: user, token: token)
        case .unregisterAll(let app, let user):
            return RegistryRecord(op: .unregisterAll, appID: app, user: user)
        case .preferences(let app, let user, let preferences):
            return RegistryRecord(op: .setPreferences, appID: app, user: user, preferences: preferences)
        case .presence(let app, let user, let online, let ttl):
            return RegistryRecord(op: .setPresence, appID: app, user: user, online: online, ttlMs: ttl)
        case .patch(let app, let user, let patch):
            return RegistryRecord(op: .patchPreferences, appID: app, user: user, patch: patch)
        case .markRead(let app, let user, let conversation, let token):
            return RegistryRecord(
                op: .markRead, appID: app, user: user, token: token, conversation: conversation,
                readAt: Int64((Date().timeIntervalSince1970 * 1000).rounded(.down)))
        }
    }
}

/// Publishes registry updates to herald.registry, keyed by user id so one user's updates stay in order.
enum RegistryPublisher {
    static func publish(
        _ update: RegistryUpdate, kafka: KafkaOptions, topics: TopicOptions, trace: RegistryTrace? = nil
    ) async throws {
        try await publish(update.record, kafka: kafka, topics: topics, trace: trace)
    }

    /// Checks the record as herald-registry will (`RegistryRecord.validationError`) and publishes it, with `trace` as
    /// its `traceparent`/`tracestate` headers when given (`--traceparent`).
    static func publish(
        _ record: RegistryRecord, kafka: KafkaOptions, topics: TopicOptions, trace: RegistryTrace? = nil
    ) async throws {
        if let problem = record.validationError() { CLI.fail("\(problem.detail)", status: 2) }
        let producer = try kafka.producer()
        // The same sink the registry API publishes through (HeraldRegistryAPI).
        let sink = KafkaRegistrySink(producer: producer, topic: topics.topics().registry)
        do {
            try await sink.publish(record, trace: trace)
            try await producer.shutdown(timeout: .seconds(10))
        } catch {
            CLI.fail("kafka: \(error)")
        }
    }
}
