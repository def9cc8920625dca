import Foundation
import HeraldCore
import HeraldPipeline
import Synchronization
import Testing

// Resolve's paged fan-out of a conversation bigger than a page: records leave page by page through the loop's
// `emit`, progress is saved after each acknowledged page, and a redelivered event goes on where it stopped.

/// Fan-out progress in memory (Redis in the stage).
final class MemoryProgress: FanOutProgress {
    let saved = Mutex<[String: String]>([:])
    func fanOutCursor(app: String, eventID: String) async throws -> String? {
        saved.withLock { $0["\(app)/\(eventID)"] }
    }
    func saveFanOutCursor(app: String, eventID: String, cursor: String) async throws {
        saved.withLock { $0["\(app)/\(eventID)"] = cursor }
    }
}

/// What the loop's `emit` received; fails (as at shutdown) after `failAfter` calls when set.
final class EmitLog: Sendable {
    let calls = Mutex<[[StageOutput]]>([])
    let failAfter: Int?
    init(failAfter: Int? = nil) { self.failAfter = failAfter }
    var keys: [String] { calls.withLock { $0.flatMap { $0.map(\.key) } } }
    var pages: Int { calls.withLock { $0.count } }
    func context(stopping: @escaping @Sendable () -> Bool = { false }) -> BatchContext {
        var context = BatchContext(now: { fixedNow }, isStopping: stopping)
        context.emit = { outputs, _ in
            self.calls.withLock { calls -> Bool in
                if let limit = self.failAfter, calls.count >= limit { return false }
                calls.append(outputs)
                return true
            }
        }
        return context
    }
}

@Suite struct PagedFanOutTests {
    static let members = (1...25).map { String(format: "m%02d", $0) }

    func fixture() -> FixtureStateReader {
        var users: [String: UserState] = [:]
        for m in Self.members {
            users[m] = UserState(devices: [
                Device(
                    token: "t-\(m)", kind: .apns, environment: .production,
                    bundleID: "com.example.chat", registeredAt: 1)
            ])
        }
        return FixtureStateReader(fixtures: [
            "app1": StateFixture(
                users: users,
                conversations: [
                    "big": ConversationState(members: Self.members),
                    "c1": ConversationState(members: ["m01", "m02", "m03"]),
                ])
        ])
    }

    func input(_ id: String, conversation: String) throws -> StageInput {
        let json = """
            {"event_id": "\(id)", "app_id": "app1", "kind": "message", "created_at": 1732000000000,
             "sender": {"id": "m01", "name": "M"}, "conversation": {"id": "\(conversation)", "type": "group"},
             "message": {"id": "x", "type": "text", "text": "Hi"}}
            """
        let event = try ChatEvent.decode(Array(json.utf8))
        return StageInput(
            topic: "herald.ingested", value: StageCodec.encode(IngestedRecord(event: event, ingestedAt: 0)))
    }

    @Test func bigConversationLeavesPageByPageInInputOrder() async throws {
        let progress = MemoryProgress()
        let resolve = ResolveProcessor(
            resolvedTopic: "herald.resolved", state: fixture(), pageSize: 10, progress: progress)
        let log = EmitLog()
        let results = await resolve.process(
            [try input("e0", conversation: "c1"), try input("e1", conversation: "big")],
            context: log.context())
        // The small conversation's records first (input order), then the big one in pages of at most 10.
        #expect(log.keys == ["m02", "m03"] + Self.members.dropFirst())
        #expect(log.pages == 4)
        #expect(results.allSatisfy { $0.outputs.isEmpty && !$0.handBack && $0.deadLetter == nil })
        #expect(results[1].explain.first?.count == 24)
        #expect(progress.saved.withLock { $0["app1/e1"] } == "done")

        // Redelivered after it finished: nothing again.
        let again = EmitLog()
        _ = await resolve.process([try input("e1", conversation: "big")], context: again.context())
        #expect(again.keys.isEmpty)
    }

    @Test func aRestartGoesOnAfterTheLastAcknowledgedPage() async throws {
        let progress = MemoryProgress()
        let resolve = ResolveProcessor(
            resolvedTopic: "herald.resolved", state: fixture(), pageSize: 10, progress: progress)
        // Shutdown after two pages were acknowledged: the event is handed back.
        let first = EmitLog(failAfter: 2)
        let results = await resolve.process([try input("e1", conversation: "big")], context: first.context())
        #expect(results[0].handBack)
        #expect(first.keys == Array(Self.members[1..<20]))
        // Redelivered: only the rest, nobody lost, nobody twice.
        let second = EmitLog()
        let rest = await resolve.process([try input("e1", conversation: "big")], context: second.context())
        #expect(!rest[0].handBack)
        #expect(second.keys == Array(Self.members[20...]))
        #expect(Set(first.keys + second.keys) == Set(Self.members.dropFirst()))
    }

    @Test func withoutEmitTheWholeConversationIsInTheResult() async throws {
        let resolve = ResolveProcessor(resolvedTopic: "herald.resolved", state: fixture(), pageSize: 10)
        let results = await resolve.process([try input("e1", conversation: "big")], context: fixedContext)
        #expect(results[0].outputs.map(\.key) == Array(Self.members.dropFirst()))
    }
}

/// Counts in memory: every (event, user) counted once; the counts after it are how many events the user got.
final class MemoryCounter: MessageCounter {
    let seen = Mutex<[String: Set<String>]>([:])
    func count(app: String, _ keys: [CountKey]) async throws -> [CountsAfter] {
        seen.withLock { seen in
            keys.map { key in
                let counted = seen[key.user, default: []].insert(key.eventID).inserted
                let n = seen[key.user]?.count ?? 0
                return CountsAfter(
                    counted: counted, unreadTotal: n, unreadConversation: n, mentionTotal: 0,
                    mentionConversation: 0)
            }
        }
    }
}

@Suite struct PagedFanOutCountingTests {
    @Test("Herald-kept counts reach every recipient of a paged fan-out and of the small events beside it")
    func countsOnThePagedPath() async throws {
        var app = AppConfig(appID: "app1")
        app.counts = true
        let counting = ResolveCounting(counter: MemoryCounter(), apps: AppDirectory(apps: ["app1": app]))
        let resolve = ResolveProcessor(
            resolvedTopic: "herald.resolved", state: PagedFanOutTests().fixture(),
            counting: counting, pageSize: 10, progress: MemoryProgress())
        let log = EmitLog()
        let batch = [
            try PagedFanOutTests().input("e0", conversation: "c1"),
            try PagedFanOutTests().input("e1", conversation: "big"),
        ]
        _ = await resolve.process(batch, context: log.context())
        let records = try log.calls.withLock { $0.flatMap { $0 } }.map {
            try StageCodec.decode(ResolvedRecord.self, from: $0.value)
        }
        #expect(records.count == 2 + 24)
        // m02 and m03 are in both conversations: two events counted; everyone else one.
        for r in records {
            let expected = ["m02", "m03"].contains(r.recipient) && r.event.eventID == "e1" ? 2 : 1
            #expect(r.state.unread.total == expected, "\(r.recipient) of \(r.event.eventID)")
        }
    }
}

/// A counter that records that it was called.
final class StartedCounter: MessageCounter {
    let base = MemoryCounter()
    let started = Atomic<Bool>(false)
    func count(app: String, _ keys: [CountKey]) async throws -> [CountsAfter] {
        started.store(true, ordering: .sequentiallyConsistent)
        return try await base.count(app: app, keys)
    }
}

/// A state reader whose users' states come only once `counter` was called, within a minute (else it fails the
/// read): resolve's counting must be under way while the states are read, not wait for them.
struct CountingFirstReader: StateReader {
    let base: FixtureStateReader
    let counter: StartedCounter

    struct CountNotStarted: Error {}

    func members(_ conversations: [ConversationRef]) async throws -> [[String]] {
        try await base.members(conversations)
    }
    func loadUsers(app: String, users: [String], now: Int64) async throws -> [String: UserState] {
        try await base.loadUsers(app: app, users: users, now: now)
    }
    func loadUsers(
        app: String, users: [String], conversations: [[String]], preferencesOnly: [String], now: Int64
    ) async throws -> [String: UserState] {
        let deadline = ContinuousClock.now + .seconds(60)
        while !counter.started.load(ordering: .sequentiallyConsistent) {
            if ContinuousClock.now >= deadline { throw CountNotStarted() }
            try await Task.sleep(for: .milliseconds(5))
        }
        return try await base.loadUsers(
            app: app, users: users, conversations: conversations, preferencesOnly: preferencesOnly, now: now)
    }
    func memberPages(_ conversations: [ConversationRef], cursors: [String], count: Int) async throws -> [MemberPage] {
        try await base.memberPages(conversations, cursors: cursors, count: count)
    }
    func memberCount(_ conversation: ConversationRef) async throws -> Int {
        try await base.memberCount(conversation)
    }
}

@Suite struct CountingBesideStateReadsTests {
    static func counting(_ counter: StartedCounter) -> ResolveCounting {
        var app = AppConfig(appID: "app1")
        app.counts = true
        return ResolveCounting(counter: counter, apps: AppDirectory(apps: ["app1": app]))
    }

    @Test("a batch's counting goes out while its recipients' states are read, not after them")
    func batchCountsBesideStateReads() async throws {
        let counter = StartedCounter()
        let resolve = ResolveProcessor(
            resolvedTopic: "herald.resolved",
            state: CountingFirstReader(base: PagedFanOutTests().fixture(), counter: counter),
            counting: Self.counting(counter))
        let results = await resolve.process(
            [try PagedFanOutTests().input("e0", conversation: "c1")], context: fixedContext)
        #expect(results[0].deadLetter == nil, "\(String(describing: results[0].deadLetter))")
        #expect(!results[0].outputs.isEmpty)
        let records = try results[0].outputs.map { try StageCodec.decode(ResolvedRecord.self, from: $0.value) }
        #expect(records.allSatisfy { $0.state.unread.total == 1 })
    }

    @Test("a paged fan-out's small event counts while its recipients' states are read")
    func pagedPathCountsBesideStateReads() async throws {
        let counter = StartedCounter()
        let resolve = ResolveProcessor(
            resolvedTopic: "herald.resolved",
            state: CountingFirstReader(base: PagedFanOutTests().fixture(), counter: counter),
            counting: Self.counting(counter), pageSize: 10, progress: MemoryProgress())
        let log = EmitLog()
        let results = await resolve.process(
            [try PagedFanOutTests().input("e0", conversation: "c1")], context: log.context())
        #expect(results[0].deadLetter == nil, "\(String(describing: results[0].deadLetter))")
        let outputs = log.calls.withLock { $0.flatMap { $0 } } + results[0].outputs
        let records = try outputs.map { try StageCodec.decode(ResolvedRecord.self, from: $0.value) }
        #expect(records.map(\.recipient).sorted() == ["m02", "m03"])
        #expect(records.allSatisfy { $0.state.unread.total == 1 })
    }
}
