import Foundation
import HeraldCore
import HeraldPipeline
import HeraldRedis

// The Redis side of the stage processors' ports. A broken or timed-out connection becomes a
// `TransientFailure` (the processor retries the batch with backoff); any other Redis error is passed on.

private func transient<T>(_ body: () async throws -> T) async throws -> T {
    do {
        return try await body()
    } catch let error as RedisError where error.isRetryable {
        throw TransientFailure("\(error)")
    }
}

/// resolve's reads: members in one pipelined round trip, user states through `StateStore.loadUsers`.
public struct RedisStateReader: StateReader {
    public let store: StateStore

    public init(store: StateStore) { self.store = store }

    public func members(_ conversations: [ConversationRef]) async throws -> [[String]] {
        try await transient {
            let commands = conversations.map {
                RedisCommand("SMEMBERS", RedisKeys.members(app: $0.appID, conversation: $0.conversation))
            }
            let replies = try await store.connection.pipeline(commands)
            guard replies.count == commands.count else {
                throw RedisError(.unexpectedReply, "expected \(commands.count) replies, got \(replies.count)")
            }
            return try replies.map { reply in
                let value = try reply.orThrow("SMEMBERS")
                if value.isNull { return [] }
                guard let items = value.array else { throw RedisError(.unexpectedReply, "SMEMBERS answered \(value)") }
                return items.compactMap(\.text).sorted()
            }
        }
    }

    public func loadUsers(app: String, users: [String], now: Int64) async throws -> [String: UserState] {
        try await transient { try await store.loadUsers(app: app, users: users, now: now) }
    }

    public func loadUsers(
        app: String, users: [String], conversations: [[String]], preferencesOnly: [String], now: Int64
    ) async throws -> [String: UserState] {
        try await transient {
            try await store.loadUsers(
                app: app, users: users, now: now, preferencesOnly: preferencesOnly,
                conversationsOf: conversations)
        }
    }

    /// `SSCAN key cursor COUNT n` for each conversation, pipelined. Small sets come back whole with cursor 0.
    public func memberPages(
        _ conversations: [ConversationRef], cursors: [String], count: Int
    ) async throws -> [MemberPage] {
        try await transient {
            try await store.memberPages(
                conversations.map { (app: $0.appID, conversation: $0.conversation) }, cursors: cursors, count: count
            ).map { MemberPage(members: $0.members, next: $0.next) }
        }
    }

    public func memberCount(_ conversation: ConversationRef) async throws -> Int {
        try await transient {
            let reply = try await store.connection.send(
                RedisCommand(
                    "SCARD", RedisKeys.members(app: conversation.appID, conversation: conversation.conversation))
            ).orThrow("SCARD")
            return Int(reply.int ?? 0)
        }
    }
}

/// resolve's fan-out progress: `herald:<app>:fanout:{<event>}` (kept a day).
public struct RedisFanOutProgress: FanOutProgress {
    public let connection: RedisConnection
    public var ttlMilliseconds: Int64 = 86_400_000

    public init(connection: RedisConnection) { self.connection = connection }

    public func fanOutCursor(app: String, eventID: String) async throws -> String? {
        try await transient {
            let reply = try await connection.send(RedisCommand("GET", RedisKeys.fanOut(app: app, eventId: eventID)))
                .orThrow("GET")
            return reply.isNull ? nil : reply.text
        }
    }

    public func saveFanOutCursor(app: String, eventID: String, cursor: String) async throws {
        try await transient {
            _ = try await connection.send(
                RedisCommand(
                    "SET", RedisKeys.fanOut(app: app, eventId: eventID), cursor,
                    "PX", ttlMilliseconds)
            ).orThrow("SET")
        }
    }
}

/// send's idempotency records: claims and confirmations in Redis (`StateStore.claim`).
public struct RedisDeliveryLedger: DeliveryLedger {
    public let store: StateStore
    /// The replay window: a copy of a delivered pair that arrives within this long is not sent again.
    public let windowMilliseconds: Int64

    public init(store: StateStore, windowMilliseconds: Int64) {
        self.store = store
        self.windowMilliseconds = windowMilliseconds
    }

    public func claim(
        app: String, pairs: [DeliveryPair], owner: String, ttlMilliseconds claimTTL: Int64,
        now: Int64
    ) async throws -> [ClaimOutcome] {
        try await transient {
            try await store.claim(
                app: app, pairs: pairs, owner: owner, ttlMilliseconds: claimTTL, now: now,
                window: windowMilliseconds
            )
            .map { claim in
                switch claim {
                case .claimed: .claimed
                case .delivered: .delivered
                case .pending(_, let until): .pendingElsewhere(until: until)
                }
            }
        }
    }

    public func confirm(app: String, pairs: [DeliveryPair], now: Int64) async throws {
        try await transient {
            try await store.confirmDelivered(
                app: app, pairs: pairs, now: now, window: windowMilliseconds)
        }
    }

    public func release(app: String, pairs: [DeliveryPair], owner: String, now: Int64) async throws {
        try await transient {
            try await store.releaseClaims(
                app: app, pairs: pairs, owner: owner, now: now, window: windowMilliseconds)
        }
    }
}

/// registry's writes through `StateStore`.
public struct RedisRegistryWriter: RegistryWriter {
    public let store: StateStore
    /// Presence TTL when a `set_presence` record carries none.
    public let presenceTTLMilliseconds: Int64
    /// The bounds of one user's stored preferences: a write beyond them throws `PreferenceLimitError`.
    public let preferenceLimits: PreferenceLimits

    public init(
        store: StateStore, presenceTTLMilliseconds: Int64, preferenceLimits: PreferenceLimits = PreferenceLimits()
    ) {
        self.store = store
        self.presenceTTLMilliseconds = presenceTTLMilliseconds
        self.preferenceLimits = preferenceLimits
    }

    public func apply(_ record: RegistryRecord, now: Int64) async throws -> String {
        try await transient {
            let app = record.appID
            let user = record.user ?? ""
            switch record.op {
            case .registerDevice:
                guard let device = record.device else { return "invalid" }
                let r = try await store.registerDeviceReporting(
                    app: app, user: user, device: device,
                    unique: record.unique ?? false)
                if r.movedFrom != nil { return r.evicted.isEmpty ? "applied_moved" : "applied_moved_evicted" }
                return r.evicted.isEmpty ? "applied" : "applied_evicted"
            case .unregisterDevice:
                return try await store.unregisterDevice(app: app, user: user, token: record.token ?? "")
                    ? "applied" : "not_registered"
            case .unregisterAll:
                _ = try await store.unregisterAll(app: app, user: user)
                return "applied"
            case .setPreferences:
                try await store.setPreferences(
                    app: app, user: user, preferences: record.preferences ?? Preferences(), limits: preferenceLimits)
                return "applied"
            case .setPresence:
                try await store.setPresence(
                    app: app, user: user, online: record.online ?? [],
                    ttlMilliseconds: record.ttlMs ?? presenceTTLMilliseconds, now: now)
                return "applied"
            case .setUnread:
                try await store.setUnread(app: app, user: user, unread: record.unread ?? Unread())
                return "applied"
            case .setMembers:
                try await store.setMembers(
                    app: app, conversation: record.conversation ?? "", members: record.members ?? [])
                return "applied"
            case .addMembers:
                try await store.addMembers(
                    app: app, conversation: record.conversation ?? "", members: record.members ?? [])
                return "applied"
            case .removeMembers:
                try await store.removeMembers(
                    app: app, conversation: record.conversation ?? "", members: record.members ?? [])
                return "applied"
            case .patchPreferences:
                guard let patch = record.patch else { return "invalid" }
                try await store.patchPreferences(app: app, user: user, patch: patch, limits: preferenceLimits)
                return "applied"
            case .markRead:
                try await store.markRead(app: app, user: user, conversation: record.conversation)
                return "applied"
            }
        }
    }

    public func removeDeadToken(_ feedback: TokenFeedbackRecord) async throws -> String {
        try await transient {
            try await store.removeDeadToken(
                app: feedback.appID, user: feedback.user, token: feedback.token,
                deadSince: feedback.deadSince
            ).rawValue
        }
    }
}

/// registry's read sync: the user's state and the rate-limit script (docs/behaviour.md §6c).
public struct RedisReadSyncStore: ReadSyncStore {
    public let store: StateStore

    public init(store: StateStore) { self.store = store }

    public func userState(app: String, user: String, conversation: String?, now: Int64) async throws -> UserState {
        try await transient {
            try await store.loadUsers(
                app: app, users: [user], now: now, conversationsOf: [conversation.map { [$0] } ?? []]
            )[user] ?? UserState()
        }
    }

    public func admit(
        app: String, user: String, conversation: String?, readAt: Int64?, now: Int64, policy: ReadSyncPolicy
    ) async throws -> ReadSyncOutcome {
        try await transient {
            try await store.admitReadSync(
                app: app, user: user, conversation: conversation, readAt: readAt, now: now, policy: policy)
        }
    }
}

/// The explain trail in Redis.
public struct RedisExplainSink: ExplainSink {
    public let store: ExplainStore

    public init(store: ExplainStore) { self.store = store }

    public func record(_ entries: [ExplainEntry]) async throws {
        try await store.record(entries)
    }

    public func keeps(_ entry: ExplainEntry) -> Bool { store.keeps(entry) }

    public func keepsRoutine(appID: String, eventID: String, user: String?) -> Bool {
        store.keepsRoutine(appID: appID, eventID: eventID, user: user)
    }
}
