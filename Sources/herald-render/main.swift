// herald-render: herald.deliverable -> herald.outbound, one rendered APNs request per target device
// (keyed by device token). Render errors -> herald.dlq.
import Foundation
import HeraldConfig
import HeraldPipeline
import HeraldStage

let setup = await StageSetup.startOrExit(.render)
let topics = setup.pipeline.kafka.topics
let processor = RenderProcessor(outboundTopic: topics.outbound, apps: setup.pipeline.apps)
exit(await setup.run(processor: processor, topics: [topics.deliverable], explain: setup.bestEffortExplainSink()))
