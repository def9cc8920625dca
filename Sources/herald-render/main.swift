// herald-render: herald.deliverable -> herald.outbound, one rendered APNs request per target device
// (keyed by device token). Render errors -> herald.dlq.
import Foundation
import HeraldConfig
import HeraldPipeline
import HeraldStage

let setup: StageSetup
do {
    setup = try await StageSetup.start(.render)
} catch {
    FileHandle.standardError.write(Data("herald-render: \(error)\n".utf8))
    exit(2)
}
let topics = setup.pipeline.kafka.topics
let redis = try? setup.redis()
setup.context.readiness.remove("redis")
let processor = RenderProcessor(outboundTopic: topics.outbound, apps: setup.pipeline.apps)
exit(await setup.run(processor: processor, topics: [topics.deliverable], explain: redis.map { setup.explainSink($0) }))
