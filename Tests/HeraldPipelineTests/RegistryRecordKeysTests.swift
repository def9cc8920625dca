import Foundation
import HeraldCore
import HeraldPipeline
import Testing

/// The registry refuses a `herald.registry` record with a key it does not know; every key Herald's own writer
/// (the registry API, heraldctl) puts in a record must therefore be known, for every op.
@Suite struct RegistryRecordKeysTests {
    @Test("a record with every field set, of each op, is applied, not dead-lettered for an unknown key")
    func everyWrittenKeyIsKnown() async throws {
        var patch = PreferencePatch()
        patch.set.trigger = .off
        let writer = MemoryRegistry()
        let registry = RegistryProcessor(tokenFeedbackTopic: "herald.token-feedback", writer: writer)
        let inputs = RegistryRecord.Op.allCases.map { op in
            let record = RegistryRecord(
                op: op, appID: "app1", user: "u2", device: Device(token: "ab", registeredAt: 1),
                unique: true, token: "ab", preferences: Preferences(), online: ["ab"], ttlMs: 1000,
                unread: Unread(total: 1), conversation: "c1", members: ["u1"], patch: patch)
            return StageInput(topic: "herald.registry", value: StageCodec.encode(record))
        }
        let results = await registry.process(inputs, context: fixedContext)
        for (op, result) in zip(RegistryRecord.Op.allCases, results) {
            #expect(result.deadLetter == nil, "\(op.rawValue): \(result.deadLetter.map { "\($0)" } ?? "")")
        }
        #expect(writer.applied == RegistryRecord.Op.allCases)
    }
}
