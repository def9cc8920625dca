// Ingest admission, fan-out and the suppression rules (docs/behaviour.md §4 to §6).
// Every stage and `heraldctl simulate` call exactly these functions.

import Foundation
import Synchronization

// MARK: Ingest

/// Why ingest drops an event (docs/behaviour.md §4 reason codes).
public enum DropReason: String, Sendable, Hashable, CaseIterable {
    /// Open and super-group channels never push.
    case channelType = "channel_type"
    /// Not a valid chat event; it goes to the DLQ with the error.
    case invalid
    /// A valid event with a number outside its `InputRanges` range; it goes to the DLQ naming the field.
    case outOfRange = "out_of_range"
}

/// What ingest does with one record.
public enum Admission: Sendable {
    case admit(ChatEvent)
    case drop(DropReason, detail: String)
}

public enum Ingest {
    /// Decodes, validates and admits one `chat.events` record.
    public static func admit(_ bytes: some Collection<UInt8>) -> Admission {
        let event: ChatEvent
        do {
            event = try ChatEvent.decode(bytes)
        } catch {
            return .drop(DropReason(rawValue: error.reason) ?? .invalid, detail: error.description)
        }
        return admit(event)
    }

    /// Admits an already validated event.
    public static func admit(_ event: ChatEvent) -> Admission {
        if event.kind == .conversationRead {
            return .drop(
                .invalid,
                detail:
                    "kind: conversation_read is made by herald-registry from a mark_read record (publish mark_read to the registry topic)"
            )
        }
        if event.digest != nil {
            return .drop(
                .invalid, detail: "digest is made by herald-suppress when Do Not Disturb or a snooze ends (§6d)")
        }
        switch event.conversation.type {
        case .open, .supergroup:
            return .drop(.channelType, detail: "conversation.type is \(event.conversation.type.rawValue)")
        case .direct, .group:
            break
        }
        if let outside = event.rangeError() { return .drop(.outOfRange, detail: outside.description) }
        if let problem = nothingToPush(event) {
            return .drop(.invalid, detail: problem.description)
        }
        return .admit(event)
    }

    /// An event with no pushable content: a text or admin message whose text
    /// is empty and which sets no `em_push_content` and no loc-key.
    static func nothingToPush(_ event: ChatEvent) -> FieldError? {
        guard event.kind == .message || event.kind == .messageEdited, let m = event.message, m.type != .file else {
            return nil
        }
        let a = event.ext.apns
        if m.text.isEmpty && (a.pushContent ?? "").isEmpty && a.bodyLocKey == nil && a.titleLocKey == nil {
            return FieldError(field: "message.text", message: "empty (nothing to push)")
        }
        return nil
    }
}

// MARK: Fan-out

public enum FanOut {
    /// Everyone the event is considered for, in order, without duplicates: the
    /// explicit recipients, else the conversation's members. The sender is
    /// *included* when listed, so rule 1 reports it as `sender`; stages use
    /// `recipients(of:members:)` to skip loading the sender's state.
    public static func candidates(of event: ChatEvent, members: [String]) -> [String] {
        let source = event.recipients ?? members
        var seen = Set<String>()
        seen.reserveCapacity(source.count)
        var out: [String] = []
        out.reserveCapacity(source.count)
        for user in source where seen.insert(user).inserted { out.append(user) }
        return out
    }

    /// The candidates minus the sender: the users whose state resolve loads.
    public static func recipients(of event: ChatEvent, members: [String]) -> [String] {
        candidates(of: event, members: members).filter { $0 != event.sender.id }
    }
}

// MARK: Suppression

/// Why a recipient is not woken, in rule order (docs/behaviour.md §6 reason codes).
public enum SuppressionReason: String, Sendable, Hashable, CaseIterable {
    case sender
    /// The app's push is off (`push: off` in the pipeline file).
    case appOff = "app_off"
    case ignored
    case noDevices = "no_devices"
    case online
    case conversationOff = "conversation_off"
    case muted
    case triggerOff = "trigger_off"
    case notMentioned = "not_mentioned"
    case snoozed
    case dnd
}

/// The outcome of the rules for one recipient.
public enum Decision: Sendable, Hashable {
    case deliver(targets: [Device])
    case suppress(SuppressionReason)

    public var reason: SuppressionReason? {
        if case .suppress(let r) = self { return r }
        return nil
    }

    public var targets: [Device] {
        if case .deliver(let t) = self { return t }
        return []
    }
}

public enum Suppression {
    /// Applies rules 1 to 10 for one recipient. `now` is used only when the
    /// event has no `created_at` (the rules evaluate at the event time).
    public static func decide(
        event: ChatEvent, recipient: String, state: UserState, app: AppConfig,
        now: Date
    ) -> Decision {
        decide(
            event: event, recipient: recipient, state: state, app: app,
            at: event.ruleTime(now: now.millisecondsSince1970))
    }

    /// Applies rules 1 to 10 at an explicit time (epoch milliseconds).
    public static func decide(
        event: ChatEvent, recipient: String, state: UserState, app: AppConfig,
        at millis: Int64
    ) -> Decision {
        // 1. Never the sender.
        if recipient == event.sender.id { return .suppress(.sender) }
        // 1. The app's push is off: nobody is woken (the app stays listed, so nothing is dead-lettered).
        if !app.push { return .suppress(.appOff) }
        // 2. em_ignore_notification: nothing overrides it.
        if event.ext.ignoreNotification { return .suppress(.ignored) }
        // 3. Devices that can take this kind of push; an every-recipient webhook stands for a device of each user.
        let candidates = pushableDevices(event: event, state: state)
        let everyRecipient = app.webhooks.contains { $0.everyRecipient }
        if candidates.isEmpty && !everyRecipient { return .suppress(.noDevices) }
        // 4. Presence.
        var targets: [Device]
        switch app.multiDevice {
        case .allOffline:
            if !state.online.isEmpty { return .suppress(.online) }
            targets = candidates
        case .anyOffline:
            let online = Set(state.online)
            if candidates.isEmpty {
                if !online.isEmpty { return .suppress(.online) }
            } else if !candidates.contains(where: { !online.contains($0.token) }) {
                return .suppress(.online)
            }
            targets = candidates
        case .offlineOnly:
            if state.online.isEmpty {
                targets = candidates
            } else {
                let online = Set(state.online)
                targets = candidates.filter { !online.contains($0.token) }
                if targets.isEmpty { return .suppress(.online) }
            }
        }
        if everyRecipient { addEveryRecipientWebhooks(to: &targets, recipient: recipient, app: app) }
        // 5. em_force_notification skips rules 6 to 9.
        if event.ext.forceNotification { return .deliver(targets: targets) }
        // 6. Conversation off or muted.
        let conv =
            state.preferences.conversations.isEmpty
            ? ConversationPreference()
            : (state.preferences.conversations[event.conversation.id] ?? ConversationPreference())
        if conv.trigger == .off { return .suppress(.conversationOff) }
        if conv.muted { return .suppress(.muted) }
        // 7. Effective trigger.
        let trigger: PushTrigger
        switch conv.trigger {
        case .default: trigger = app.effectivePreferences(state.preferences).trigger
        case .all: trigger = .all
        case .mentionOnly: trigger = .mentionOnly
        case .off: trigger = .off
        }
        switch trigger {
        case .off: return .suppress(.triggerOff)
        case .mentionOnly: if !event.mentions(recipient) { return .suppress(.notMentioned) }
        case .all: break
        }
        // 8. Snooze.
        if let snooze = state.preferences.snooze, snooze.covers(millis) { return .suppress(.snoozed) }
        // 9. Do not disturb in the user's time zone.
        if let dnd = state.preferences.dnd, DNDClock.covers(dnd, millis: millis) { return .suppress(.dnd) }
        // 10. Deliver.
        return .deliver(targets: targets)
    }

    /// The app's every-recipient webhook providers the user has no `webhook` device of, as devices of theirs.
    static func addEveryRecipientWebhooks(to targets: inout [Device], recipient: String, app: AppConfig) {
        for hook in app.webhooks where hook.everyRecipient {
            let registered = targets.contains {
                $0.kind == .webhook && app.webhook($0.providerID)?.providerID == hook.providerID
            }
            if !registered { targets.append(hook.everyRecipientDevice(user: recipient)) }
        }
    }

    /// Rule 3's candidates: on Apple's side chat goes to `apns` tokens; a ringing call (`initiated`)
    /// goes to `voip` tokens when the user has any, else to `apns` tokens as an alert; every other call
    /// action goes to `apns` tokens (an alert or a background push, see `CallAction.applePush`), because
    /// iOS 13+ requires each VoIP push to report a new CallKit call. Every `fcm` and `webhook` device
    /// takes both chat and calls. Registration order is kept.
    public static func pushableDevices(event: ChatEvent, state: UserState) -> [Device] {
        if state.devices.allSatisfy({ $0.kind == .apns }) { return state.devices }
        var appleKind = Device.Kind.apns
        if event.kind == .call, event.call?.action.applePush == .ring,
            state.devices.contains(where: { $0.kind == .voip })
        {
            appleKind = .voip
        }
        return state.devices.filter {
            $0.kind == appleKind || $0.kind == .fcm || $0.kind == .webhook || $0.kind == .webpush
        }
    }
}

extension ChatEvent.CallAction {
    /// How a call action reaches an Apple device.
    public enum ApplePush: String, Sendable, Hashable {
        /// Through PushKit to a `voip` token (push type `voip`); the app reports a CallKit call.
        case ring
        /// A visible alert to an `apns` token (a missed call).
        case alert
        /// A background push (`content-available`, priority 5) to an `apns` token, so a running or
        /// suspended app can end its ringing screen; nothing is shown.
        case background
    }

    /// `initiated` rings; `unanswered` and `cancelled` leave a missed-call alert; `ongoing`, `rejected`,
    /// `ended` and `busy` only update the app (docs/behaviour.md §7).
    public var applePush: ApplePush {
        switch self {
        case .initiated: return .ring
        case .unanswered, .cancelled: return .alert
        case .ongoing, .rejected, .ended, .busy: return .background
        }
    }
}

/// Local time of day in an IANA zone. `TimeZone(identifier:)` is cached
/// because creating one per decision is costly. An unknown identifier is read
/// as UTC (documented in docs/core.md).
public enum DNDClock {
    /// The zones made so far; its lock is held only for a dictionary lookup or insert.
    private static let zones = Mutex<[String: TimeZone]>([:])

    static func zone(_ identifier: String) -> TimeZone {
        if let z = zones.withLock({ $0[identifier] }) { return z }
        let z = TimeZone(identifier: identifier) ?? TimeZone(secondsFromGMT: 0) ?? TimeZone.gmt
        zones.withLock { zones in
            if zones.count < 4096 { zones[identifier] = z }
        }
        return z
    }

    /// Minutes since local midnight (0..<1440) at `millis` in the zone.
    public static func minuteOfDay(millis: Int64, timezone: String) -> Int {
        let date = Date(timeIntervalSince1970: Double(millis) / 1000)
        let offset = Int64(zone(timezone).secondsFromGMT(for: date))
        let localSeconds = millis / 1000 + offset - (millis < 0 && millis % 1000 != 0 ? 1 : 0)
        let secondOfDay = ((localSeconds % 86_400) + 86_400) % 86_400
        return Int(secondOfDay / 60)
    }

    public static func covers(_ dnd: DoNotDisturb, millis: Int64) -> Bool {
        dnd.covers(minuteOfDay: minuteOfDay(millis: millis, timezone: dnd.timezone))
    }

    /// Whether `identifier` names a time zone tzdata knows.
    public static func isKnown(_ identifier: String) -> Bool { TimeZone(identifier: identifier) != nil }
}
