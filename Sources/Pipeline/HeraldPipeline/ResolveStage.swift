import Foundation
import HeraldCore
import Synchronization

/// Where resolve reads state (Redis in the stage; a fixture in tests). Each call is one round trip.
/// Implementations throw `TransientFailure` when the same call may succeed later.
public protocol StateReader: Sendable {
    /// The members of each conversation, in one round trip.
    func members(_ conversations: [ConversationRef]) async throws -> [[String]]
    /// Devices, presence (as of `now`), preferences and every unread count of `users`, in one round trip.
    func loadUsers(app: String, users: [String], now: Int64) async throws -> [String: UserState]
    /// What resolve reads, in one round trip: for `users` their devices, presence, preferences, unread total and
    /// only the unread counts of the conversations in `conversations` (parallel to `users`: those the user is a
    /// recipient in), so a user in many conversations costs no more than one in a few; for `preferencesOnly`
    /// (senders who are not recipients) only the preferences, for the display name.
    func loadUsers(
        app: String, users: [String], conversations: [[String]], preferencesOnly: [String], now: Int64
    ) async throws -> [String: UserState]
    /// One page of each conversation's members from `cursors` (Redis `SSCAN`, about `count` members), in one
    /// round trip. A page whose `next` is "0" ends its conversation. A member may appear on two pages.
    func memberPages(_ conversations: [ConversationRef], cursors: [String], count: Int) async throws -> [MemberPage]
    /// How many members a conversation has (`SCARD`).
    func memberCount(_ conversation: ConversationRef) async throws -> Int
}

/// A page of a conversation's members.
public struct MemberPage: Sendable, Hashable {
    public var members: [String]
    /// Where the next page starts; "0" when this was the last one.
    public var next: String
    public init(members: [String], next: String) {
        self.members = members
        self.next = next
    }
}

extension StateReader {
    /// Readers that cannot read less load the users and senders whole.
    public func loadUsers(
        app: String, users: [String], conversations: [[String]], preferencesOnly: [String], now: Int64
    ) async throws -> [String: UserState] {
        try await loadUsers(app: app, users: users + preferencesOnly, now: now)
    }

    /// `users`, all recipients in `conversation`, with that conversation's unread count.
    func loadUsers(
        app: String, users: [String], conversation: String, preferencesOnly: [String] = [], now: Int64
    ) async throws -> [String: UserState] {
        try await loadUsers(
            app: app, users: users, conversations: Array(repeating: [conversation], count: users.count),
            preferencesOnly: preferencesOnly, now: now)
    }

    /// Readers without paging answer the whole member list as one page.
    public func memberPages(
        _ conversations: [ConversationRef], cursors: [String], count: Int
    ) async throws -> [MemberPage] {
        try await members(conversations).map { MemberPage(members: $0, next: "0") }
    }

    public func memberCount(_ conversation: ConversationRef) async throws -> Int {
        try await members([conversation]).first?.count ?? 0
    }
}

/// Where resolve remembers how far a paged fan-out got (Redis in the stage), so a restart goes on from the last
/// acknowledged page instead of sending the whole conversation again.
public protocol FanOutProgress: Sendable {
    /// The cursor after the last acknowledged page of `eventID`'s fan-out, "done" when it finished; nil if none.
    func fanOutCursor(app: String, eventID: String) async throws -> String?
    func saveFanOutCursor(app: String, eventID: String, cursor: String) async throws
}

public struct ConversationRef: Sendable, Hashable {
    public var appID: String
    public var conversation: String
    public init(appID: String, conversation: String) {
        self.appID = appID
        self.conversation = conversation
    }
}

/// resolve: `herald.ingested` -> `herald.resolved` (one record per recipient, keyed by recipient user id).
///
/// For a whole batch: one round trip for the members of the conversations whose events name no explicit
/// recipients, then one round trip per app (normally one) for the state of every recipient and sender of the
/// batch (the sender's push display name comes from their preferences); for apps that count, the counting call goes
/// out beside the state reads (the connection pipelines them). Never a round trip per recipient.
public struct ResolveProcessor: StageProcessor {
    public let stage = "resolve"
    public var resolvedTopic: String
    public var state: any StateReader
    /// Called when a transient state failure is retried (for logs / metrics).
    public var onTransientFailure: @Sendable (TransientFailure) -> Void
    /// Lanes: each recipient's record goes to `resolvedTopic` unless its own class (`Priority.classify` with
    /// the member count and the recipient) belongs to the other lane, e.g. the members a message in the
    /// priority lane does not mention; those go to `lanes.topic(lane)`. Nil: everything to `resolvedTopic`.
    public var lanes: (priority: String, bulk: String, apps: AppDirectory)?
    /// Herald-kept counts for the apps that opt in (ResolveCounting.swift); nil: counts come from `set_unread`.
    public var counting: ResolveCounting?
    /// The apps as the pipeline file now says (reloaded on SIGHUP or when the file changes): when set, each batch
    /// takes the current directory for `lanes` and `counting`.
    public var live: LiveAppDirectory?
    /// Members per page. A conversation with more members is fanned out page by page (members, their state,
    /// records produced and acknowledged, progress saved), so resolve's memory does not grow with it.
    public var pageSize: Int
    /// Where a paged fan-out's progress is kept (nil: a restart starts the fan-out over; send's claims skip what
    /// was already delivered).
    public var progress: (any FanOutProgress)?

    public init(
        resolvedTopic: String, state: any StateReader,
        lanes: (priority: String, bulk: String, apps: AppDirectory)? = nil,
        counting: ResolveCounting? = nil,
        pageSize: Int = 2000, progress: (any FanOutProgress)? = nil,
        onTransientFailure: @escaping @Sendable (TransientFailure) -> Void = { _ in }
    ) {
        self.resolvedTopic = resolvedTopic
        self.state = state
        self.lanes = lanes
        self.counting = counting
        self.pageSize = max(1, pageSize)
        self.progress = progress
        self.onTransientFailure = onTransientFailure
    }

    public func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        if let live {
            var current = self
            current.live = nil
            let apps = live.current
            current.lanes?.apps = apps
            current.counting?.apps = apps
            return await current.process(batch, context: context)
        }
        let now = context.nowMillis
        var results = [StageResult?](repeating: nil, count: batch.count)
        var events: [(index: Int, event: ChatEvent)] = []
        for (index, input) in batch.enumerated() {
            do {
                let event = try input.decode(IngestedRecord.self).event
                if let apps = lanes?.apps, !apps.isKnown(event.appID) {
                    results[index] = .dlq(AppDirectory.unknownAppReason, AppDirectory.unknownAppDetail(event.appID))
                    continue
                }
                events.append((index, event))
            } catch {
                results[index] = error.result
            }
        }
        if events.isEmpty { return results.map { $0 ?? StageResult() } }

        // Round trip 1: members of the conversations without explicit recipients.
        var refs: [ConversationRef] = []
        var refIndex: [ConversationRef: Int] = [:]
        for (_, event) in events where event.recipients == nil {
            let ref = ConversationRef(appID: event.appID, conversation: event.conversation.id)
            if refIndex[ref] == nil {
                refIndex[ref] = refs.count
                refs.append(ref)
            }
        }
        var members: [[String]] = []
        var paged: [ConversationRef: String] = [:]  // conversations with more pages: the next cursor
        do {
            if !refs.isEmpty {
                let size = pageSize
                guard
                    let pages = try await context.retryingTransient(
                        {
                            try await state.memberPages(
                                refs, cursors: Array(repeating: "0", count: refs.count), count: size)
                        }, onRetry: onTransientFailure)
                else {
                    return handBack(results)
                }
                members = pages.map(\.members)
                for (ref, page) in zip(refs, pages) where page.next != "0" { paged[ref] = page.next }
            }
        } catch {
            return fail(results, events, "state_error", "members: \(error)")
        }
        if !paged.isEmpty {
            if context.emit != nil {
                return await processPaged(
                    batch, events: events, results: results, refIndex: refIndex,
                    firstPages: members, paged: paged, context: context)
            }
            // No way to produce ahead (tests): read the rest of each big conversation here.
            do {
                for (ref, cursor) in paged {
                    guard
                        let rest = try await context.retryingTransient(
                            { try await readRest(ref, from: cursor) },
                            onRetry: onTransientFailure)
                    else {
                        return handBack(results)
                    }
                    if let i = refIndex[ref] { members[i] = Self.unique(members[i] + rest) }
                }
            } catch {
                return fail(results, events, "state_error", "members: \(error)")
            }
        }

        // Round trip 2 (per app): every recipient's state and each sender's preferences.
        var recipientsOf: [Int: [String]] = [:]
        var senderListed = Set<Int>()
        var usersByApp: [String: [String]] = [:]
        var conversationsByApp: [String: [[String]]] = [:]
        var sendersByApp: [String: [String]] = [:]
        // Per app, each user read so far: their place in the app's users, or -1 for a sender read for the name.
        var seen: [String: [String: Int]] = [:]
        // The current app's users are kept apart while its events follow one another (a batch mostly holds one
        // app), so that a recipient costs one hash, not three.
        var appID: String?
        var appSeen: [String: Int] = [:]
        var appUsers: [String] = []
        var appConversations: [[String]] = []
        func putBack() {
            guard let appID else { return }
            seen[appID] = appSeen
            if !appUsers.isEmpty {
                usersByApp[appID] = appUsers
                conversationsByApp[appID] = appConversations
            }
        }
        for (index, event) in events {
            var conversationMembers: [String] = []
            if event.recipients == nil,
                let i = refIndex[ConversationRef(appID: event.appID, conversation: event.conversation.id)],
                i < members.count
            {
                conversationMembers = members[i]
            }
            let recipients = FanOut.recipients(of: event, members: conversationMembers)
            recipientsOf[index] = recipients
            if (event.recipients ?? conversationMembers).contains(event.sender.id) { senderListed.insert(index) }
            if appID != event.appID {
                putBack()
                appID = event.appID
                appSeen = seen.removeValue(forKey: event.appID) ?? Dictionary(minimumCapacity: 4 * events.count)
                appUsers = usersByApp.removeValue(forKey: event.appID) ?? []
                appConversations = conversationsByApp.removeValue(forKey: event.appID) ?? []
            }
            let conversation = event.conversation.id
            let only = [conversation]  // one buffer shared by the event's recipients, copied only when one grows
            for user in recipients {
                if let at = appSeen[user] {
                    if !appConversations[at].contains(conversation) { appConversations[at].append(conversation) }
                } else {
                    appSeen[user] = appUsers.count
                    appUsers.append(user)
                    appConversations.append(only)
                }
            }
        }
        putBack()
        // Senders who are not recipients in this batch: only their preferences (the display name) are read.
        for (_, event) in events where seen[event.appID, default: [:]][event.sender.id] == nil {
            seen[event.appID, default: [:]][event.sender.id] = -1
            sendersByApp[event.appID, default: []].append(event.sender.id)
        }
        // Round trip 3 (per counting app) goes out with round trip 2, not after it (both are calls on the stage's
        // one Redis connection, which pipelines them): count the message events and take the counts after each.
        // Counting needs only the recipients, and counts an (event, user) once, so a batch handed back after
        // counting counts nothing twice when it comes again.
        let (countedEvents, recipientsByEvent) = (events, recipientsOf)
        async let counted = countMessages(countedEvents, recipientsOf: recipientsByEvent, context: context)
        var states: [String: [String: UserState]] = [:]
        for app in Set(usersByApp.keys).union(sendersByApp.keys).sorted() {
            let users = usersByApp[app] ?? []
            let senders = sendersByApp[app] ?? []
            do {
                guard
                    let loaded = try await context.retryingTransient(
                        {
                            try await state.loadUsers(
                                app: app, users: users, conversations: conversationsByApp[app] ?? [],
                                preferencesOnly: senders, now: now)
                        },
                        onRetry: onTransientFailure)
                else {
                    return handBack(results)
                }
                states[app] = loaded
            } catch {
                return fail(results, events, "state_error", "users of app \(app): \(error)")
            }
        }

        let counts: [Int: [String: CountsAfter]]
        switch await counted {
        case .counted(let c): counts = c
        case .handBack: return handBack(results)
        case .failed(let detail): return fail(results, events, "state_error", detail)
        }

        for (index, event) in events {
            let appStates = states[event.appID] ?? [:]
            let displayName = appStates[event.sender.id]?.preferences.displayName
            let recipients = recipientsOf[index] ?? []
            var result = StageResult()
            let reason = appendOutputs(
                event, recipients: recipients, states: appStates, counts: counts[index] ?? [:],
                displayName: displayName, memberCount: recipients.count, to: &result)
            explain(
                event, count: recipients.count, reason: reason, senderListed: senderListed.contains(index), now: now,
                context: context, into: &result)
            results[index] = result
        }
        return results.map { $0 ?? StageResult() }
    }

    /// Every member from `cursor` on (a big conversation when outputs cannot be produced ahead).
    private func readRest(_ ref: ConversationRef, from cursor: String) async throws -> [String] {
        var out: [String] = []
        var cursor = cursor
        while cursor != "0" {
            guard let page = try await state.memberPages([ref], cursors: [cursor], count: pageSize).first else { break }
            out += page.members
            cursor = page.next
        }
        return out
    }

    static func unique(_ users: [String]) -> [String] {
        var seen = Set<String>()
        return users.filter { seen.insert($0).inserted }.sorted()
    }

    /// A batch holding at least one conversation with more than a page of members. Every event's records are
    /// produced through `context.emit`, in input order (so order per recipient holds as in a normal batch): an
    /// event of a small conversation at once, a big conversation page by page. After each acknowledged page its
    /// cursor is saved (`progress`); a redelivered event goes on after the last saved page, and one whose
    /// fan-out finished produces nothing again. A crash between a page's acknowledgement and the save sends that
    /// page again: send's claims skip what was delivered.
    private func processPaged(
        _ batch: [StageInput], events: [(index: Int, event: ChatEvent)], results: [StageResult?],
        refIndex: [ConversationRef: Int], firstPages: [[String]], paged: [ConversationRef: String],
        context: BatchContext
    ) async -> [StageResult] {
        guard let emit = context.emit else { return handBack(results) }
        let now = context.nowMillis
        var out = results
        for (position, (index, event)) in events.enumerated() {
            let ref = ConversationRef(appID: event.appID, conversation: event.conversation.id)
            let first = event.recipients == nil ? refIndex[ref].map { firstPages[$0] } ?? [] : []
            do {
                var outcome: StageResult?
                if event.recipients == nil, let next = paged[ref] {
                    outcome = try await fanOutPaged(
                        event, ref: ref, firstPage: first, next: next, index: index,
                        now: now, context: context, emit: emit)
                } else if var whole = try await resolveWhole(event, members: first, now: now, context: context),
                    await emit(whole.outputs, index)
                {
                    whole.outputs = []
                    outcome = whole
                }
                guard let outcome else {
                    // Shutting down: this event and the rest are handed back (redelivered).
                    for (rest, _) in events[position...] { out[rest] = .handedBack }
                    return out.map { $0 ?? StageResult() }
                }
                out[index] = outcome
            } catch {
                out[index] = .dlq("state_error", "\(error)")
            }
        }
        return out.map { $0 ?? StageResult() }
    }

    /// One event of a small conversation (or with explicit recipients): its records and explain entries.
    /// Nil when shutting down.
    private func resolveWhole(
        _ event: ChatEvent, members: [String], now: Int64,
        context: BatchContext
    ) async throws -> StageResult? {
        let recipients = FanOut.recipients(of: event, members: members)
        let senderListed = (event.recipients ?? members).contains(event.sender.id)
        // The count goes out with the state read (see `process`).
        async let counted = countOne(event, recipients: recipients, context: context)
        guard
            let states = try await context.retryingTransient(
                {
                    try await state.loadUsers(
                        app: event.appID, users: recipients, conversation: event.conversation.id,
                        preferencesOnly: [event.sender.id], now: now)
                }, onRetry: onTransientFailure)
        else { return nil }
        guard let counts = try await counted else { return nil }
        var result = StageResult()
        let reason = appendOutputs(
            event, recipients: recipients, states: states, counts: counts,
            displayName: states[event.sender.id]?.preferences.displayName,
            memberCount: recipients.count, to: &result)
        explain(
            event, count: recipients.count, reason: reason, senderListed: senderListed, now: now, context: context,
            into: &result)
        return result
    }

    /// A big conversation, page by page from `next` (the first page is `firstPage`). Nil when shutting down.
    private func fanOutPaged(
        _ event: ChatEvent, ref: ConversationRef, firstPage: [String], next: String, index: Int,
        now: Int64, context: BatchContext,
        emit: @Sendable ([StageOutput], Int) async -> Bool
    ) async throws -> StageResult? {
        let app = event.appID
        // Where a fan-out of this event stopped before (a redelivery).
        var saved: String?
        if let progress {
            guard
                let s = try await context.retryingTransient(
                    {
                        try await progress.fanOutCursor(app: app, eventID: event.eventID)
                    }, onRetry: onTransientFailure)
            else { return nil }
            saved = s
        }
        guard
            let memberCount = try await context.retryingTransient(
                { try await state.memberCount(ref) },
                onRetry: onTransientFailure)
        else { return nil }
        let recipientCount = max(0, memberCount - 1)
        var result = StageResult()
        if saved == "done" {
            explain(
                event, count: recipientCount, reason: "resumed:done", senderListed: false, now: now, context: context,
                into: &result)
            return result
        }
        // The sender's display name rides on every record.
        guard
            let senderState = try await context.retryingTransient(
                {
                    try await state.loadUsers(
                        app: app, users: [], conversations: [], preferencesOnly: [event.sender.id], now: now)
                }, onRetry: onTransientFailure)
        else { return nil }
        let displayName = senderState[event.sender.id]?.preferences.displayName
        var page: [String]
        var cursor: String
        if let saved {
            page = []
            cursor = saved
        } else {
            page = firstPage
            cursor = next
        }
        var senderListed = false
        var reason: String?
        var states: [String: UserState]?  // the current page's, when read ahead
        while true {
            if page.contains(event.sender.id) { senderListed = true }
            let recipients = FanOut.recipients(of: event, members: page)
            var pageResult = StageResult()
            if !recipients.isEmpty {
                if states == nil {
                    guard
                        let loaded = try await context.retryingTransient(
                            {
                                try await state.loadUsers(
                                    app: app, users: recipients, conversation: event.conversation.id, now: now)
                            }, onRetry: onTransientFailure)
                    else { return nil }
                    states = loaded
                }
                // Herald-kept counts, page by page (a replayed page counts nothing: the per-(event, user) markers).
                guard let counts = try await countOne(event, recipients: recipients, context: context) else {
                    return nil
                }
                pageResult.outputs.reserveCapacity(recipients.count)
                reason = appendOutputs(
                    event, recipients: recipients, states: states ?? [:], counts: counts,
                    displayName: displayName,
                    memberCount: recipientCount, to: &pageResult)
                result.notes += pageResult.notes
            }
            // Taken out of the page's result, so `outputs = []` below frees them while the next page is read.
            var outputs: [StageOutput] = []
            swap(&outputs, &pageResult.outputs)
            let done = cursor == "0"
            // The next page (members and their state) is read while this one is produced and acknowledged.
            let from = cursor
            async let upcoming = readPage(ref, from: from, done: done, event: event, now: now, context: context)
            let emitted = outputs.isEmpty ? true : await emit(outputs, index)
            outputs = []
            var recorded = true
            if emitted, let progress {
                let value = done ? "done" : cursor
                recorded =
                    try await context.retryingTransient(
                        {
                            try await progress.saveFanOutCursor(app: app, eventID: event.eventID, cursor: value)
                        }, onRetry: onTransientFailure) != nil
            }
            let next = try await upcoming
            guard emitted, recorded else { return nil }
            if done { break }
            guard let next, !context.isStopping() else { return nil }
            page = next.members
            cursor = next.next
            states = next.states
        }
        explain(
            event, count: recipientCount, reason: reason ?? (saved != nil ? "resumed" : nil),
            senderListed: senderListed, now: now, context: context, into: &result)
        return result
    }

    /// The counts after one event for `recipients` (empty when its app keeps no counts); nil when shutting down.
    private func countOne(
        _ event: ChatEvent, recipients: [String],
        context: BatchContext
    ) async throws -> [String: CountsAfter]? {
        switch await countMessages([(index: 0, event: event)], recipientsOf: [0: recipients], context: context) {
        case .counted(let counts): return counts[0] ?? [:]
        case .handBack: return nil
        case .failed(let detail): throw CountingFailure(detail: detail)
        }
    }

    struct CountingFailure: Error, CustomStringConvertible {
        var detail: String
        var description: String { detail }
    }

    /// A page of a big conversation read ahead: members, where the next page starts, the recipients' state.
    struct PageRead: Sendable {
        var members: [String]
        var next: String
        var states: [String: UserState]
    }

    /// The page from `cursor` and its recipients' state; nil when `done` (no page left) or shutting down.
    private func readPage(
        _ ref: ConversationRef, from cursor: String, done: Bool, event: ChatEvent, now: Int64,
        context: BatchContext
    ) async throws -> PageRead? {
        if done { return nil }
        let size = pageSize
        guard
            let read = try await context.retryingTransient(
                {
                    try await state.memberPages([ref], cursors: [cursor], count: size).first
                }, onRetry: onTransientFailure)
        else { return nil }
        let members = read?.members ?? []
        let recipients = FanOut.recipients(of: event, members: members)
        var states: [String: UserState] = [:]
        if !recipients.isEmpty {
            guard
                let loaded = try await context.retryingTransient(
                    {
                        try await state.loadUsers(
                            app: event.appID, users: recipients, conversation: event.conversation.id, now: now)
                    }, onRetry: onTransientFailure)
            else { return nil }
            states = loaded
        }
        return PageRead(members: members, next: read?.next ?? "0", states: states)
    }

    /// The records of `recipients` (lane by lane when lanes are on, each class counted in a `classified` note) into
    /// `result`; returns the `fanned_out` reason.
    private func appendOutputs(
        _ event: ChatEvent, recipients: [String], states: [String: UserState],
        counts: [String: CountsAfter] = [:],
        displayName: String?, memberCount: Int, to result: inout StageResult
    ) -> String? {
        let scoped = recipients.map { user in
            let state = (states[user] ?? UserState()).scoped(to: event.conversation.id)
            guard let after = counts[user] else { return (user: user, state: state) }
            return (user: user, state: Counting.applying(after, to: state, conversation: event.conversation.id))
        }
        let encoded = ResolvedRecord.wireBytes(event: event, recipients: scoped, senderDisplayName: displayName)
        var reason: String?
        if let lanes {
            let policy = lanes.apps.app(event.appID).priority
            let whole = Priority.classify(event, policy: policy, memberCount: memberCount)
            if whole.rule == "members" { reason = "\(whole.priorityClass.rawValue):members" }
            // Recipients per class, by rank (no dictionary per event).
            var classes = InlineArray<4, Int>(repeating: 0)
            for (user, bytes) in zip(recipients, encoded) {
                let priorityClass = Priority.classify(
                    event, policy: policy, memberCount: memberCount, recipient: user
                ).priorityClass
                classes[priorityClass.rank] += 1
                result.outputs.append(
                    StageOutput(
                        topic: priorityClass.lane == .priority ? lanes.priority : lanes.bulk, key: user, value: bytes))
            }
            for priorityClass in PriorityClass.allCases where classes[priorityClass.rank] > 0 {
                result.notes.append(
                    .classified(priorityClass: priorityClass.rawValue, count: classes[priorityClass.rank]))
            }
        } else {
            for (user, bytes) in zip(recipients, encoded) {
                result.outputs.append(StageOutput(topic: resolvedTopic, key: user, value: bytes))
            }
        }
        return reason
    }

    /// The fan-out's entry (routine: made only when the trail keeps it, `BatchContext.keepsRoutine`) and the
    /// sender's.
    private func explain(
        _ event: ChatEvent, count: Int, reason: String?, senderListed: Bool, now: Int64, context: BatchContext,
        into result: inout StageResult
    ) {
        if context.keepsRoutine(appID: event.appID, eventID: event.eventID, user: nil) {
            result.explain.append(
                ExplainEntry(
                    appID: event.appID, eventID: event.eventID, stage: stage,
                    decision: "fanned_out", reason: reason, at: now, count: count))
        }
        // The sender is never woken (rule 1); say so when they were listed.
        if senderListed {
            var entry = ExplainEntry(
                appID: event.appID, eventID: event.eventID, user: event.sender.id,
                stage: stage, decision: "suppress",
                reason: SuppressionReason.sender.rawValue, at: now)
            // A member who sent the message: routine (kept as their latest decision, and in the full trail).
            // Named in the event's own recipients, it is kept like any suppression.
            entry.routine = event.recipients == nil
            result.explain.append(entry)
        }
    }

    private func handBack(_ results: [StageResult?]) -> [StageResult] {
        results.map { $0 ?? .handedBack }
    }

    private func fail(
        _ results: [StageResult?], _ events: [(index: Int, event: ChatEvent)], _ reason: String,
        _ detail: String
    ) -> [StageResult] {
        var out = results
        for (index, _) in events { out[index] = .dlq(reason, detail) }
        return out.map { $0 ?? StageResult() }
    }
}

/// A `StateReader` over an in-memory state fixture (tests, `heraldctl` previews). Counts its round trips.
public final class FixtureStateReader: StateReader, @unchecked Sendable {
    // @unchecked Sendable: `fixture` is immutable; `calls` is a `Mutex`.
    private let fixture: [String: StateFixture]
    private let calls = Mutex(0)

    /// - Parameter fixtures: per app id.
    public init(fixtures: [String: StateFixture]) {
        self.fixture = fixtures
    }

    public var roundTrips: Int { calls.withLock { $0 } }

    public func members(_ conversations: [ConversationRef]) async throws -> [[String]] {
        calls.withLock { $0 += 1 }
        return conversations.map { fixture[$0.appID]?.conversations[$0.conversation]?.members ?? [] }
    }

    /// Pages of the sorted member list; a cursor is the index of the page's first member.
    public func memberPages(
        _ conversations: [ConversationRef], cursors: [String], count: Int
    ) async throws -> [MemberPage] {
        calls.withLock { $0 += 1 }
        return zip(conversations, cursors).map { ref, cursor in
            let all = (fixture[ref.appID]?.conversations[ref.conversation]?.members ?? []).sorted()
            let start = min(all.count, Int(cursor) ?? 0)
            let end = min(all.count, start + max(1, count))
            return MemberPage(members: Array(all[start..<end]), next: end >= all.count ? "0" : String(end))
        }
    }

    public func loadUsers(app: String, users: [String], now: Int64) async throws -> [String: UserState] {
        calls.withLock { $0 += 1 }
        var out: [String: UserState] = [:]
        for user in users { out[user] = fixture[app]?.users[user] ?? UserState() }
        return out
    }
}
