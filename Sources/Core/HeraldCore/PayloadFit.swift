/// Makes a payload fit a provider's size limit, the same way for every provider (docs/behaviour.md §7):
///
/// 1. The payload as rendered, when it fits.
/// 2. Body and message text cut together to the largest common length that fits, but not below `floor` bytes each.
/// 3. If that is not enough, the optional parts (`drops`, in order: translations and CometChat's message extras,
///    then data, then extern, ...) are dropped one at a time, the cut recomputed from the full texts each time (so
///    the body gets back what a drop freed); with every part dropped, the cut may go below the floor.
/// 4. Last, the title is cut.
///
/// Lengths are JSON-escaped bytes; a cut ends on a character boundary with `…` (`Renderer.shorten`). Each search is
/// a binary search on the cut length over whole renders (a size grows with the length kept), so a payload's own
/// layout, however many times it writes a text, decides what fits.
struct PayloadFit {
    /// The largest payload, in bytes.
    let limit: Int
    /// The optional parts, dropped cumulatively in this order.
    var drops: [@Sendable (inout PayloadContent) -> Void] = PayloadFit.standardDrops
    /// The shortest the body and message text are cut to while something can still be dropped.
    var floor = 1024

    /// Translations and message extras, then data, then extern: what FCM drops.
    static let standardDrops: [@Sendable (inout PayloadContent) -> Void] = [
        {
            $0.translations = []; $0.messageExtrasDropped = true
        },
        { $0.data = "" },
        { $0.extern = nil },
    ]

    /// The payload `write` makes of `content`, made to fit; throws `payloadTooLarge` naming `what` with the size of
    /// the smallest payload when even that does not fit.
    func fit(
        _ content: PayloadContent, what: String, write: (PayloadContent) -> [UInt8]
    ) throws(RenderError) -> [UInt8] {
        var bytes = write(content)
        if bytes.count <= limit { return bytes }
        for dropped in 0...drops.count {
            var trial = content
            for drop in drops.prefix(dropped) { drop(&trial) }
            if dropped > 0 {
                bytes = write(trial)
                if bytes.count <= limit { return bytes }
            }
            let low = dropped == drops.count ? 0 : floor
            if let fitted = Self.largestFitting(
                low: low, high: Self.longest(trial), limit: limit, { write(Self.capped(trial, $0)) })
            {
                return fitted
            }
        }
        var last = Self.capped(content, 0)
        for drop in drops { drop(&last) }
        if let title = last.title {
            let length = JSONWriter.escapedLength(title) - 2
            let shortest = last
            let fitted = Self.largestFitting(low: 0, high: length, limit: limit) { level in
                var t = shortest
                t.title = Renderer.shorten(title, by: length - level)
                return write(t)
            }
            if let fitted { return fitted }
            last.title = Renderer.shorten(title, by: length)
        }
        bytes = write(last)
        throw RenderError(code: .payloadTooLarge, detail: "minimal \(what) is \(bytes.count) bytes (limit \(limit))")
    }

    /// The output for the largest level in `low...high` whose output fits `limit` (sizes grow with the level), or
    /// nil when even `low` does not fit.
    static func largestFitting(low: Int, high: Int, limit: Int, _ render: (Int) -> [UInt8]) -> [UInt8]? {
        var best = render(low)
        guard best.count <= limit else { return nil }
        var lo = low
        var hi = max(low, high)
        while lo < hi {
            let mid = (lo + hi + 1) / 2
            let out = render(mid)
            if out.count <= limit {
                lo = mid
                best = out
            } else {
                hi = mid - 1
            }
        }
        return best
    }

    /// The longer escaped length of body and message text.
    static func longest(_ c: PayloadContent) -> Int {
        max(JSONWriter.escapedLength(c.body), JSONWriter.escapedLength(c.detailText)) - 2
    }

    /// Body and message text each shortened to at most `level` escaped bytes.
    static func capped(_ c: PayloadContent, _ level: Int) -> PayloadContent {
        var out = c
        let b = JSONWriter.escapedLength(c.body) - 2
        if b > level { out.body = Renderer.shorten(c.body, by: b - level) }
        let t = JSONWriter.escapedLength(c.detailText) - 2
        if t > level { out.detailText = Renderer.shorten(c.detailText, by: t - level) }
        return out
    }
}
