// herald-suppress: herald.resolved -> herald.deliverable (keyed by recipient user id). Applies SPEC
// section 3's rules; suppressions are counted by reason and written to the explain trail in Redis.
import Foundation
import HeraldConfig
import HeraldPipeline
import HeraldStage

let setup: StageSetup
do {
    setup = try await StageSetup.start(.suppress)
} catch {
    FileHandle.standardError.write(Data("herald-suppress: \(error)\n".utf8))
    exit(2)
}
let topics = setup.pipeline.kafka.topics
let redis = try? setup.redis()
setup.context.readiness.remove("redis")
let processor = SuppressProcessor(deliverableTopic: topics.deliverable, apps: setup.pipeline.apps)
exit(await setup.run(processor: processor, topics: [topics.resolved], explain: redis.map { setup.explainSink($0) }))
