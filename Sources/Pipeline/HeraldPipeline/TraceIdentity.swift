// The event and app each stage's input is about, for the `herald.event_id` and `herald.app_id` attributes of the
// stage's span (docs/operations.md, "Tracing"): `heraldctl trace <event>` finds an event's traces by them. The loop
// asks only about traced inputs, so these decode the input again rather than keep anything from `process`.

import HeraldCore

extension IngestProcessor {
    /// The chat event's ids (nil for bytes that are not an event).
    public func traceIdentity(of input: StageInput) -> (eventID: String, appID: String)? {
        guard let bytes = input.value, let event = try? ChatEvent.decode(bytes) else { return nil }
        return (event.eventID, event.appID)
    }
}

extension ResolveProcessor {
    public func traceIdentity(of input: StageInput) -> (eventID: String, appID: String)? {
        guard let event = try? input.decode(IngestedRecord.self).event else { return nil }
        return (event.eventID, event.appID)
    }
}

extension SuppressProcessor {
    public func traceIdentity(of input: StageInput) -> (eventID: String, appID: String)? {
        guard let event = try? input.decode(ResolvedRecord.self).event else { return nil }
        return (event.eventID, event.appID)
    }
}

extension RenderProcessor {
    public func traceIdentity(of input: StageInput) -> (eventID: String, appID: String)? {
        guard let event = try? input.decode(DeliverableRecord.self).event else { return nil }
        return (event.eventID, event.appID)
    }
}

extension SendProcessor {
    public func traceIdentity(of input: StageInput) -> (eventID: String, appID: String)? {
        guard let record = try? input.decode(OutboundRecord.self) else { return nil }
        return (record.eventID, record.appID)
    }
}

// The registry's records (device registrations, preferences, read marks, dead tokens) are about a user, not an
// event: its spans carry no event id (`StageProcessor`'s default).
