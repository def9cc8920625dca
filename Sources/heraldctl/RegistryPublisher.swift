import Foundation
import HeraldCore
import HeraldKafka

/// A registry change an operator asks for with `--via-kafka`.
enum RegistryUpdate {
    case register(app: String, user: String, device: Device)
    case unregister(app: String, user: String, token: String)
    case unregisterAll(app: String, user: String)
    case preferences(app: String, user: String, preferences: Preferences)
    case presence(app: String, user: String, online: [String], ttlMilliseconds: Int64, at: Int64)

    var user: String {
        switch self {
        case .register(_, let u, _), .unregister(_, let u, _), .unregisterAll(_, let u), .preferences(_, let u, _),
             .presence(_, let u, _, _, _):
            return u
        }
    }
}

/// Publishes registry updates to herald.registry (keyed by user id, so one user's updates stay in order).
enum RegistryPublisher {
    static func publish(_ update: RegistryUpdate, kafka: KafkaOptions, topics: TopicOptions) async throws {
        let value: [UInt8]
        do {
            value = try encode(update)
        } catch {
            CLI.fail("cannot encode the registry record: \(error)")
        }
        let producer = try kafka.producer()
        do {
            let report = try await producer.send(ProducerRecord(topic: topics.topics().registry, key: update.user, value: value))
            try report.get()
            try await producer.shutdown(timeout: .seconds(10))
        } catch {
            CLI.fail("kafka: \(error.description)")
        }
    }

    static func encode(_ update: RegistryUpdate) throws -> [UInt8] {
        // Replaced by the pipeline's RegistryRecord once merged.
        throw CocoaError(.featureUnsupported)
    }
}
