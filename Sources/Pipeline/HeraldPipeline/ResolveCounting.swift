import HeraldCore

/// Where resolve counts messages for apps that keep counts (Redis in the stage; docs/behaviour.md §12).
/// Implementations throw `TransientFailure` when the same call may succeed later; counting is idempotent per
/// (event, user), so a retried or replayed batch counts nothing twice.
public protocol MessageCounter: Sendable {
    /// Counts each key once and returns the counts after it, in order, in one round trip.
    func count(app: String, _ keys: [CountKey]) async throws -> [CountsAfter]
}

/// Resolve's counting: the counter, and the apps (which of them count).
public struct ResolveCounting: Sendable {
    public var counter: any MessageCounter
    public var apps: AppDirectory

    public init(counter: any MessageCounter, apps: AppDirectory) {
        self.counter = counter
        self.apps = apps
    }
}

extension ResolveProcessor {
    /// The counts after each (event, recipient) of the batch's message events in counting apps, by event
    /// position and user: one round trip per app, in batch order, so a user's second message of the batch sees
    /// the first one counted. `.handBack` when Redis stays unavailable; `.failed` for any other error.
    enum CountOutcome {
        case counted([Int: [String: CountsAfter]])
        case handBack
        case failed(String)
    }

    func countMessages(
        _ events: [(index: Int, event: ChatEvent)], recipientsOf: [Int: [String]],
        context: BatchContext
    ) async -> CountOutcome {
        guard let counting else { return .counted([:]) }
        var keysByApp: [String: [(index: Int, key: CountKey)]] = [:]
        for (index, event) in events where counting.apps.app(event.appID).counts {
            for key in Counting.keys(for: event, recipients: recipientsOf[index] ?? []) {
                keysByApp[event.appID, default: []].append((index, key))
            }
        }
        var out: [Int: [String: CountsAfter]] = [:]
        for app in keysByApp.keys.sorted() {
            let entries = keysByApp[app] ?? []
            do {
                guard
                    let after = try await context.retryingTransient(
                        { try await counting.counter.count(app: app, entries.map(\.key)) },
                        onRetry: onTransientFailure)
                else {
                    return .handBack
                }
                guard after.count == entries.count else {
                    return .failed("counts of app \(app): \(after.count) answers for \(entries.count) keys")
                }
                for (entry, counts) in zip(entries, after) { out[entry.index, default: [:]][entry.key.user] = counts }
            } catch {
                return .failed("counts of app \(app): \(error)")
            }
        }
        return .counted(out)
    }
}
