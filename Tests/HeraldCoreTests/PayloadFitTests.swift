import Foundation
import Testing

@testable import HeraldCore

/// The one fitting procedure of every provider's payload, on a toy layout: `{"t":title,"b":body,"d":text,...}`
/// with each optional part adding its bytes.
@Suite("Payload fit: cut, drop, cut below the floor, then the title")
struct PayloadFitTests {
    static func content(body: Int, text: Int = 0, title: String? = "Title") -> PayloadContent {
        PayloadContent(
            title: title, body: String(repeating: "b", count: body), detailText: String(repeating: "d", count: text),
            translations: [("fr", String(repeating: "t", count: 600))], data: String(repeating: "x", count: 700),
            extern: .string(String(repeating: "e", count: 800)))
    }

    static func write(_ c: PayloadContent) -> [UInt8] {
        var w = JSONWriter(capacity: 4096)
        w.raw("{\"t\":"); w.string(c.title ?? "")
        w.raw(",\"b\":"); w.string(c.body)
        w.raw(",\"d\":"); w.string(c.detailText)
        if !c.translations.isEmpty { w.raw(",\"tr\":"); w.string(c.translations[0].1) }
        w.raw(",\"x\":"); w.string(c.data)
        if case .string(let e)? = c.extern { w.raw(",\"e\":"); w.string(e) }
        w.byte(UInt8(ascii: "}"))
        return w.bytes
    }

    static func parsed(_ bytes: [UInt8]) throws -> [String: String] {
        guard case .object(let fields) = try JSONValue.parse(bytes) else { return [:] }
        return Dictionary(uniqueKeysWithValues: fields.compactMap { k, v in v.stringValue.map { (k, $0) } })
    }

    @Test("a payload that fits is left as rendered")
    func fitsUntouched() throws {
        let c = Self.content(body: 100)
        let out = try PayloadFit(limit: 4096).fit(c, what: "payload", write: Self.write)
        #expect(out == Self.write(c))
    }

    @Test("body and text are cut together to the largest length that fits, the optional parts kept")
    func cutBeforeDropping() throws {
        let c = Self.content(body: 2500, text: 2500)
        let out = try PayloadFit(limit: 6000).fit(c, what: "payload", write: Self.write)
        let fields = try Self.parsed(out)
        #expect(out.count <= 6000)
        #expect(fields["tr"] != nil && fields["x"] != nil && fields["e"] != nil)
        let body = try #require(fields["b"])
        #expect(body.hasSuffix(Renderer.ellipsis))
        #expect(body.utf8.count >= 1024)
        #expect(fields["d"]?.utf8.count == body.utf8.count)
        // One more byte of each text does not fit: the cut is the largest.
        #expect(Self.write(PayloadFit.capped(c, body.utf8.count + 1)).count > 6000)
    }

    @Test("below the floor, the optional parts go one at a time in order, then the texts go under the floor")
    func dropsInOrder() throws {
        let content = Self.content(body: 3000, text: 3000)
        // At the floor (1,024 bytes each) the texts fit with data and extern, not with the translations too.
        let roomy = PayloadFit(limit: 2048 + 700 + 800 + 60)
        let first = try Self.parsed(roomy.fit(content, what: "payload", write: Self.write))
        #expect(first["tr"] == nil)
        #expect(first["x"]?.isEmpty == false && first["e"] != nil)
        #expect(try #require(first["b"]).utf8.count >= 1024)

        // Not even the floor fits without everything optional: all of it goes, and the texts are cut below it.
        let tight = try Self.parsed(PayloadFit(limit: 1500).fit(content, what: "payload", write: Self.write))
        #expect(tight["tr"] == nil && tight["x"] == "" && tight["e"] == nil)
        #expect(try #require(tight["b"]).utf8.count < 1024)
    }

    @Test("the title is cut last, and a payload that cannot fit is refused with its smallest size")
    func titleLastThenRefused() throws {
        let title = String(repeating: "T", count: 300)
        let c = Self.content(body: 3000, text: 3000, title: title)
        let out = try PayloadFit(limit: 200).fit(c, what: "payload", write: Self.write)
        let fields = try Self.parsed(out)
        #expect(out.count <= 200)
        #expect(try #require(fields["t"]).hasSuffix(Renderer.ellipsis))
        #expect(fields["b"] == Renderer.ellipsis)

        #expect(throws: RenderError.self) { try PayloadFit(limit: 20).fit(c, what: "payload", write: Self.write) }
        do {
            _ = try PayloadFit(limit: 20).fit(c, what: "toy message", write: Self.write)
        } catch {
            #expect(error.code == .payloadTooLarge)
            #expect(error.detail.hasPrefix("minimal toy message is "))
        }
    }
}
