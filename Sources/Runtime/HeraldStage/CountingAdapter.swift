import Foundation
import HeraldCore
import HeraldPipeline
import HeraldRedis

/// resolve's `MessageCounter` over Redis (`StateStore.countMessages`, one Lua script per key, pipelined). A broken
/// or timed-out connection becomes a `TransientFailure`: the batch is retried, and the per-(event, user) markers
/// make the retry count nothing twice.
public struct RedisMessageCounter: MessageCounter {
    public let store: StateStore
    /// How long a counted event is remembered per user (a replay within it counts nothing).
    public let markerTTLMilliseconds: Int64

    public init(store: StateStore, markerTTLMilliseconds: Int64) {
        self.store = store
        self.markerTTLMilliseconds = markerTTLMilliseconds
    }

    public func count(app: String, _ keys: [CountKey]) async throws -> [CountsAfter] {
        do {
            return try await store.countMessages(app: app, keys, markerTTLMilliseconds: markerTTLMilliseconds)
        } catch let error as RedisError where error.isRetryable {
            throw TransientFailure("\(error)")
        }
    }
}
