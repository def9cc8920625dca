import Foundation
import HeraldCore

/// suppress: `herald.resolved` -> `herald.deliverable` (keyed by recipient user id).
/// Applies the rules of docs/behaviour.md §6 (`Suppression.decide`, at the event's time); every suppression is
/// counted by reason and written to the explain trail, and so is every decision to deliver. With a `BurstLedger`,
/// a delivery that may be coalesced (§6a) is stepped through its burst, the whole batch in one round trip: the
/// first message of a burst goes on as it is, later ones as updates of its notification or held back
/// (`coalesced`). Then, for apps with a flood guard (§6b), each push still to be shown is counted against its user's
/// limit per minute, the batch in one more round trip; beyond it the push is held for the next minute's summary
/// (`flood_guard`). Before both, with a `Translator`, the deliveries of apps with a translator whose recipient's first
/// preferred language the event carries no translation into get one (docs/behaviour.md §7a): one request per message
/// and language in the batch, the answer added to the event's translations in the deliverable record, so render
/// needs no network; a failed request sends the original text, and the decision's explain entry says why.
public struct SuppressProcessor: StageProcessor {
    public let stage = "suppress"
    public var deliverableTopic: String
    public var apps: AppDirectory
    /// The apps as the pipeline file now says (reloaded on SIGHUP or when the file changes, docs/operations.md
    /// "Reloading"): when set, each batch takes the current directory in place of `apps`.
    public var live: LiveAppDirectory?
    /// Where bursts are kept (Redis in the stage); nil: nothing is coalesced.
    public var bursts: (any BurstLedger)?
    /// The lane this processor's input and output belong to (a held message's flush goes to its lane's topic).
    public var lane: Lane = .bulk
    /// Told when the burst ledger fails (the batch is then delivered without coalescing, never held up).
    public var onBurstFailure: @Sendable (any Error) -> Void = { _ in }
    /// Where digests are counted (docs/behaviour.md §6d; Redis in the stage); nil: none.
    public var digests: (any DigestLedger)?
    /// Told when the digest ledger fails (the batch's messages stay suppressed, without a digest).
    public var onDigestFailure: @Sendable (any Error) -> Void = { _ in }
    /// Where the translations of apps with a `translator:` are had; nil: nothing is translated.
    public var translator: (any Translator)?
    /// The events decoded by the last batch, for the next one (`EventReuseCarry`).
    let events = EventReuseCarry()

    public init(deliverableTopic: String, apps: AppDirectory) {
        self.deliverableTopic = deliverableTopic
        self.apps = apps
    }

    /// What a translation is decided on for one recipient: the whole event and the recipient's preferred languages.
    struct TranslationView {
        let event: ChatEvent
        let languages: [String]
    }

    /// One input after the rules: a finished result, or a delivery still to be written.
    enum Decided {
        case done(StageResult)
        case deliver(Delivery)
        /// Suppressed by the snooze or Do Not Disturb, and counted for the user's digest.
        case counted(StageResult, DigestCount)
    }

    /// A delivery still to be written: the record as the rules read it, the devices to push and the input's parts
    /// that go on unchanged. A class, so the batch's passes over the decisions (bursts, flood guard, outputs) share
    /// it instead of copying the record.
    final class Delivery: Sendable {
        let record: ResolvedRecord
        let targets: [Device]
        let forwarded: ForwardedParts?
        /// The event's wire bytes in place of the forwarded ones (a translation added).
        let event: [UInt8]?
        /// Why the push goes out untranslated (`Translation.failedReason`), for the explain trail.
        let untranslated: String?
        /// The input's trace context (`StageInput.trace`), kept with its burst if it is held.
        let trace: TracePropagation?

        init(_ read: RulesRecord, targets: [Device], trace: TracePropagation? = nil) {
            self.record = read.record
            self.targets = targets
            self.forwarded = read.forwarded
            self.event = nil
            self.untranslated = nil
            self.trace = trace
        }

        private init(
            record: ResolvedRecord, targets: [Device], forwarded: ForwardedParts?, event: [UInt8]?,
            untranslated: String?, trace: TracePropagation?
        ) {
            self.record = record
            self.targets = targets
            self.forwarded = forwarded
            self.event = event
            self.untranslated = untranslated
            self.trace = trace
        }

        /// The same delivery with `translated` (its event with a translation added; `bytes`: its wire bytes) as
        /// the record's event.
        func with(translated: ChatEvent, bytes: [UInt8]) -> Delivery {
            guard forwarded != nil else {
                var whole = record
                whole.event = translated
                return Delivery(
                    record: whole, targets: targets, forwarded: nil, event: nil, untranslated: nil, trace: trace)
            }
            return Delivery(
                record: record, targets: targets, forwarded: forwarded, event: bytes, untranslated: nil, trace: trace)
        }

        /// The same delivery, going out untranslated because of `failure`.
        func with(failure: TranslationFailure) -> Delivery {
            Delivery(
                record: record, targets: targets, forwarded: forwarded, event: event,
                untranslated: Translation.failedReason(failure), trace: trace)
        }

        /// The whole event and the recipient's preferred languages, when the recipient has a first language the
        /// translator has a code for; nil otherwise, or when the forwarded bytes do not read (render refuses the record
        /// then). The event is decoded only for such a recipient.
        func translationView(reusing reuse: inout EventReuse) -> TranslationView? {
            guard let forwarded else {
                return TranslationView(event: record.event, languages: record.state.preferences.languages)
            }
            guard let languages = try? forwarded.preferredLanguages(), languages.first.flatMap(Translation.code) != nil,
                let event = try? forwarded.wholeEvent(reusing: &reuse)
            else { return nil }
            return TranslationView(event: event, languages: languages)
        }

        /// The `herald.deliverable` record render reads: the event, the recipient, the push settings and unread
        /// counts (its devices are the targets), at burst position `burst`.
        func wireBytes(burst: Int?) -> [UInt8] {
            if let forwarded {
                return DeliverableRecord.wireBytes(forwarding: forwarded, event: event, targets: targets, burst: burst)
            }
            var state = record.state
            state.devices = []
            state.online = []
            var deliverable = DeliverableRecord(
                event: record.event, recipient: record.recipient, state: state,
                targets: targets, senderDisplayName: record.senderDisplayName)
            deliverable.burst = burst
            return deliverable.wireBytes()
        }
    }

    public func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        let now = context.now()
        var current = self
        if let live { current.apps = live.current }
        var reuse = events.take()
        var decided: [Decided] = []
        decided.reserveCapacity(batch.count)
        for input in batch { decided.append(current.decide(input, now: now, reuse: &reuse)) }
        events.keep(reuse)
        var translationNotes: [Int: StageNote] = [:]
        if let translator { translationNotes = await current.translate(&decided, using: translator) }
        let steps = await current.burstSteps(decided, now: now)
        let floods = await current.floodSteps(decided, steps: steps, now: now)
        let counted = await current.countDigests(decided, now: now)
        return decided.enumerated().map { index, d in
            var result: StageResult
            switch d {
            case .done(let done): result = done
            case .counted(var done, _):
                if let outcome = counted[index] { done.notes.append(.digest(outcome: outcome)) }
                result = done
            case .deliver(let d):
                if case .held? = floods[index] {
                    result = current.floodHeld(d.record, now: now)
                } else {
                    result = current.deliverResult(d, step: steps[index], now: now)
                }
            }
            if let note = translationNotes[index] { result.notes.append(note) }
            return result
        }
    }

    /// Adds the translations the batch's deliveries lack (docs/behaviour.md §7a): for each delivery of an app with a
    /// translator whose recipient's first preferred language the event carries no translation into
    /// (`Translation.missingLanguage`), one request per (message, language) in the batch, all in one `translate` call;
    /// each answer goes into the event of every delivery that asked for it, under that recipient's own language tag.
    /// A failed request leaves the deliveries untranslated, marked with the reason. Returns each request's note
    /// (`translation(outcome:)`), on the first delivery that asked for it.
    func translate(_ decided: inout [Decided], using translator: any Translator) async -> [Int: StageNote] {
        // One request per message and language: the same text of the same message (two events of it in a batch)
        // is asked once; an edit's new text is another request.
        struct Key: Hashable {
            let app: String
            let message: String
            let target: String
            let source: String
            let text: String
        }
        struct Ask {
            let index: Int
            let request: Int
            let language: String
            let event: ChatEvent
        }
        // Most deployments translate nothing: one look at the apps, not one per delivery.
        guard apps.fallback.translator != nil || apps.apps.values.contains(where: { $0.translator != nil }) else {
            return [:]
        }
        // Whole events, read apart from the rules' partial ones (a reuse entry serves one kind of read).
        var whole = EventReuse()
        var requests: [TranslationRequest] = []
        var requestOf: [Key: Int] = [:]
        var asks: [Ask] = []
        for index in decided.indices {
            guard case .deliver(let delivery) = decided[index], Translation.mayTranslate(delivery.record.event),
                let policy = apps.app(delivery.record.event.appID).translator,
                let view = delivery.translationView(reusing: &whole),
                let language = Translation.missingLanguage(view.event, languages: view.languages),
                let message = view.event.message, let target = Translation.code(language)
            else { continue }
            let source = Translation.sourceCode(message)
            let key = Key(
                app: view.event.appID, message: message.id, target: target, source: source, text: message.text)
            let request: Int
            if let known = requestOf[key] {
                request = known
            } else {
                request = requests.count
                requestOf[key] = request
                requests.append(
                    TranslationRequest(
                        appID: view.event.appID, messageID: message.id, text: message.text, source: source,
                        target: target, policy: policy))
            }
            asks.append(Ask(index: index, request: request, language: language, event: view.event))
        }
        if requests.isEmpty { return [:] }
        var outcomes = await translator.translate(requests)
        if outcomes.count != requests.count { outcomes = requests.map { _ in .failed(.transport) } }
        var notes: [Int: StageNote] = [:]
        var noted = Set<Int>()
        // One copy of each event per language tag, shared by the recipients it goes to.
        struct Copy: Hashable {
            let event: String
            let language: String
        }
        var translated: [Copy: (event: ChatEvent, bytes: [UInt8])] = [:]
        for ask in asks {
            let outcome = outcomes[ask.request]
            if noted.insert(ask.request).inserted { notes[ask.index] = .translation(outcome: outcome.metricOutcome) }
            guard case .deliver(let delivery) = decided[ask.index] else { continue }
            switch outcome {
            case .cached(let text), .translated(let text):
                let id = Copy(event: ask.event.eventID, language: ask.language)
                let copy: (event: ChatEvent, bytes: [UInt8])
                if let known = translated[id] {
                    copy = known
                } else {
                    let event = ask.event.adding(translation: text, language: ask.language)
                    copy = (event, event.wireBytes)
                    translated[id] = copy
                }
                decided[ask.index] = .deliver(delivery.with(translated: copy.event, bytes: copy.bytes))
            case .failed(let failure):
                decided[ask.index] = .deliver(delivery.with(failure: failure))
            }
        }
        return notes
    }

    public func process(_ input: StageInput, now: Date) -> StageResult {
        var reuse = EventReuse()
        switch decide(input, now: now, reuse: &reuse) {
        case .done(let result), .counted(let result, _): return result
        case .deliver(let d): return deliverResult(d, step: nil, now: now)
        }
    }

    /// The burst step of each delivery that may be coalesced, by input index (one round trip). Bursts are timed on
    /// the stage's clock, like their flushes: a backlog of a conversation's messages read at once is one burst.
    func burstSteps(_ decided: [Decided], now: Date) async -> [Int: BurstStep] {
        guard let bursts else { return [:] }
        let nowMillis = BatchContext.millis(now)
        var asks: [(index: Int, message: BurstMessage)] = []
        for (index, d) in decided.enumerated() {
            guard case .deliver(let delivery) = d else { continue }
            // Most apps coalesce nothing: look at the app before taking copies of the record.
            let app = apps.app(delivery.record.event.appID)
            guard app.coalesce.isOn else { continue }
            let record = delivery.record
            let event = record.event
            guard Coalescing.eligible(event, recipient: record.recipient, app: app) else { continue }
            let held = delivery.wireBytes(burst: nil)
            asks.append(
                (
                    index,
                    BurstMessage(
                        appID: event.appID, user: record.recipient, conversation: event.conversation.id,
                        at: nowMillis, policy: app.coalesce, lane: lane, record: held, trace: delivery.trace?.held)
                ))
        }
        return await step(asks, on: bursts)
    }

    /// The flood guard's step of each push still to be shown (not held by its burst) in an app with the guard on,
    /// by input index (one more round trip; docs/behaviour.md §6b). Calls, forced messages and deletions pass.
    func floodSteps(_ decided: [Decided], steps: [Int: BurstStep], now: Date) async -> [Int: BurstStep] {
        guard let bursts else { return [:] }
        let nowMillis = BatchContext.millis(now)
        var asks: [(index: Int, message: BurstMessage)] = []
        for (index, d) in decided.enumerated() {
            guard case .deliver(let delivery) = d else { continue }
            if case .held? = steps[index] { continue }
            let app = apps.app(delivery.record.event.appID)
            guard app.floodGuard.isOn else { continue }
            let record = delivery.record
            let event = record.event
            guard !FloodGuard.exempt(event) else { continue }
            var message = BurstMessage(
                appID: event.appID, user: record.recipient, conversation: "", at: nowMillis, policy: app.coalesce,
                lane: lane,
                record: delivery.wireBytes(burst: nil), trace: delivery.trace?.held)
            message.flood = app.floodGuard
            asks.append((index, message))
        }
        return await step(asks, on: bursts)
    }

    /// The steps of `asks` in one ledger round trip, by input index; none when the ledger fails (the batch is then
    /// delivered as it is, never held up).
    func step(_ asks: [(index: Int, message: BurstMessage)], on ledger: any BurstLedger) async -> [Int: BurstStep] {
        if asks.isEmpty { return [:] }
        do {
            let steps = try await ledger.step(asks.map(\.message))
            guard steps.count == asks.count else { return [:] }
            var out: [Int: BurstStep] = [:]
            for (ask, step) in zip(asks, steps) { out[ask.index] = step }
            return out
        } catch {
            onBurstFailure(error)
            return [:]
        }
    }

    /// A push held back by the flood guard: the summary at the next minute shows it.
    func floodHeld(_ record: ResolvedRecord, now: Date) -> StageResult {
        var held = suppressed(record, reason: FloodGuard.heldReason, now: now)
        held.notes.append(.coalesced(outcome: "flood_held"))
        return held
    }

    func decide(_ input: StageInput, now: Date, reuse: inout EventReuse) -> Decided {
        let read: RulesRecord
        do { read = try input.readForRules(reusing: &reuse) } catch { return .done(error.result) }
        let record = read.record
        let event = record.event
        guard apps.isKnown(event.appID) else {
            return .done(.dlq(AppDirectory.unknownAppReason, AppDirectory.unknownAppDetail(event.appID)))
        }
        let decision = Suppression.decide(
            event: event, recipient: record.recipient, state: record.state,
            app: apps.app(event.appID), now: now)
        switch decision {
        case .suppress(let reason):
            let result = suppressed(record, reason: reason.rawValue, now: now)
            if digests != nil, let count = digestCount(read, reason: reason, now: now, trace: input.trace) {
                return .counted(result, count)
            }
            return .done(result)
        case .deliver(let targets):
            return .deliver(Delivery(read, targets: targets, trace: input.trace))
        }
    }

    func suppressed(_ record: ResolvedRecord, reason: String, now: Date) -> StageResult {
        let event = record.event
        return StageResult(
            notes: [.suppressed(reason: reason)],
            explain: [
                ExplainEntry(
                    appID: event.appID, eventID: event.eventID, user: record.recipient, stage: stage,
                    decision: "suppress", reason: reason, at: BatchContext.millis(now))
            ])
    }

    func deliverResult(_ delivery: Delivery, step: BurstStep?, now: Date) -> StageResult {
        let record = delivery.record
        let event = record.event
        var burst: Int?
        var reason: String?
        var notes: [StageNote] = []
        switch step {
        case .held?:
            var held = suppressed(record, reason: Coalescing.heldReason, now: now)
            held.notes.append(.coalesced(outcome: "held"))
            return held
        case .first?: burst = 1
        case .update(let count)?:
            burst = count
            reason = Coalescing.updateReason
            notes = [.coalesced(outcome: "update")]
        case nil: break
        }
        // A push going out untranslated says why (docs/behaviour.md §7a); the update's note still counts it.
        if let untranslated = delivery.untranslated { reason = untranslated }
        // What the rules did not read goes on as the bytes it came in (when they are in the current format).
        let output = StageOutput(
            topic: deliverableTopic, key: record.recipient, value: delivery.wireBytes(burst: burst))
        return StageResult(
            outputs: [output],
            notes: notes,
            explain: [
                ExplainEntry(
                    appID: event.appID, eventID: event.eventID, user: record.recipient, stage: stage,
                    decision: "deliver", reason: reason, at: BatchContext.millis(now), count: delivery.targets.count)
            ])
    }
}
