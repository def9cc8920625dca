// herald-suppress: herald.resolved -> herald.deliverable (keyed by recipient user id). Applies the rules
// of docs/behaviour.md §6; suppressions are counted by reason and written to the explain trail in Redis.
import Foundation
import HeraldConfig
import HeraldPipeline
import HeraldStage

let setup = await StageSetup.startOrExit(.suppress)
let topics = setup.pipeline.kafka.topics
let processor = SuppressProcessor(deliverableTopic: topics.deliverable, apps: setup.pipeline.apps)
exit(await setup.run(processor: processor, topics: [topics.resolved], explain: setup.bestEffortExplainSink()))
