// herald-send: herald.outbound + herald.retry -> APNs and FCM over HTTP/2, custom webhooks over HTTPS/1.1;
// dead tokens -> herald.token-feedback,
// retryable failures -> herald.retry, permanent failures -> herald.dlq. Idempotency records in Redis.
import Foundation
import HeraldAPNs
import HeraldConfig
import HeraldCore
import HeraldPipeline
import HeraldRedis
import HeraldStage

/// send's own environment keys, with their defaults (docs/pipeline.md).
enum SendKey: String, CaseIterable {
    case connections = "HERALD_APNS_CONNECTIONS"          // 2 per credential
    case timeoutMs = "HERALD_APNS_TIMEOUT_MS"              // 30000: deadline of one request
    case maxInFlight = "HERALD_SEND_MAX_IN_FLIGHT"         // 2000 notifications in flight
    case maxAttempts = "HERALD_SEND_MAX_ATTEMPTS"          // 6 attempts, then DLQ
    case retryInitialMs = "HERALD_SEND_RETRY_INITIAL_MS"   // 1000: first herald.retry delay
    case retryMaxMs = "HERALD_SEND_RETRY_MAX_MS"           // 60000: longest herald.retry delay
    case fcmHost = "HERALD_FCM_HOST"                       // fcm.googleapis.com:443 (host:port override for tests)
    case fcmCAFile = "HERALD_FCM_CA_FILE"                  // system store: CAs for FCM and its token endpoint
    case fcmConnections = "HERALD_FCM_CONNECTIONS"         // 2 per FCM credential
    case webhookCAFile = "HERALD_WEBHOOK_CA_FILE"          // system store: CAs for webhook endpoints
    case priorityReservePercent = "HERALD_SEND_PRIORITY_RESERVE_PERCENT" // 20: streams and slots bulk may not take
}

let setup = await StageSetup.startOrExit(.send, extraKnownKeys: Set(SendKey.allCases.map(\.rawValue) + [PipelineReloader.watchKey]))
let redis = setup.redisOrExit()
func setting(_ key: SendKey, _ fallback: Int) -> Int {
    guard let raw = setup.environment(key.rawValue) else { return fallback }
    guard let value = Int(raw), value > 0 else {
        setup.logger.warning("ignoring \(key.rawValue)=\(raw): expected a positive integer; using \(fallback)")
        return fallback
    }
    return value
}
let env = setup.context.environment
var endpoint: APNsEndpoint?
if !env.apnsHost.isEmpty {
    guard let parsed = APNsEndpoint(parsing: env.apnsHost) else {
        setup.logger.critical("HERALD_APNS_HOST=\(env.apnsHost) is not host[:port]")
        exit(2)
    }
    endpoint = parsed
}
let maxInFlight = setting(.maxInFlight, 2_000)
KeyFiles.warnAboutExposedKeys(setup.pipeline.apps, logger: setup.logger)
let transport = APNsPushTransport(apps: setup.pipeline.apps, endpoint: endpoint,
                                  caFile: env.apnsCAFile.isEmpty ? nil : env.apnsCAFile,
                                  connections: setting(.connections, 2), maxInFlight: maxInFlight,
                                  priorityReserve: Double(min(90, setting(.priorityReservePercent, 20))) / 100,
                                  timeout: .milliseconds(setting(.timeoutMs, 30_000)),
                                  environment: ProcessInfo.processInfo.environment, logger: setup.logger)
var fcmEndpoint: APNsEndpoint?
if let raw = setup.environment(SendKey.fcmHost.rawValue), !raw.isEmpty {
    guard let parsed = APNsEndpoint(parsing: raw) else {
        setup.logger.critical("HERALD_FCM_HOST=\(raw) is not host[:port]")
        exit(2)
    }
    fcmEndpoint = parsed
}
let fcmTransport = FCMPushTransport(apps: setup.pipeline.apps, endpoint: fcmEndpoint,
                                    caFile: setup.environment(SendKey.fcmCAFile.rawValue).flatMap { $0.isEmpty ? nil : $0 },
                                    connections: setting(.fcmConnections, 2), maxInFlight: maxInFlight,
                                    timeout: .milliseconds(setting(.timeoutMs, 30_000)), logger: setup.logger)
setup.context.readiness.register("fcm") { fcmTransport.isReady }
let webhookTransport = WebhookPushTransport(apps: setup.pipeline.apps,
                                            caFile: setup.environment(SendKey.webhookCAFile.rawValue).flatMap { $0.isEmpty ? nil : $0 },
                                            maxInFlight: maxInFlight, environment: ProcessInfo.processInfo.environment,
                                            logger: setup.logger)
let router = RoutingPushTransport(apns: transport, fcm: fcmTransport, webhook: webhookTransport)
// An app with no APNs credential (FCM or webhooks only) does not wait for an APNs connection.
setup.context.readiness.register("apns") {
    transport.hasClients ? transport.isConnected : (fcmTransport.hasClients || webhookTransport.hasClients)
}

let topics = setup.pipeline.kafka.topics
let logger = setup.logger
let metrics = setup.context.metrics
// The priority lane has a Redis connection of its own: its claims and confirmations never queue behind a bulk
// batch's.
let priorityRedis = setup.redisOrExit()
func store(_ lane: Lane) -> StateStore {
    StateStore(connection: lane == .priority ? priorityRedis : redis, logger: logger)
}
let timeoutMs = setting(.timeoutMs, 30_000)
func sender(_ lane: Lane) -> SendProcessor {
var processor = SendProcessor(
    retryTopic: topics.retry(lane), tokenFeedbackTopic: topics.tokenFeedback, transport: router,
    ledger: RedisDeliveryLedger(store: store(lane), ttlMilliseconds: Int64(setup.pipeline.redis.idempotencyTTLSeconds) * 1000),
    owner: "\(setup.context.environment.instance)-\(UUIDString.random())",
    // A claim outlives the longest a request can take (queueing for a stream, then its deadline).
    claimTTL: .milliseconds(2 * timeoutMs + 30_000),
    retryPolicy: APNsBackoffPolicy(initialDelay: .milliseconds(setting(.retryInitialMs, 1000)),
                                   maxDelay: .milliseconds(setting(.retryMaxMs, 60_000)),
                                   maxAttempts: setting(.maxAttempts, 6)),
    onTransientFailure: { failure in
        metrics.redisError(code: "transient")
        logger.warning("redis unavailable; retrying", metadata: ["error": "\(failure)"])
    })
processor.prioritized = lane == .priority
return processor
}
// Batches run concurrently (order per device token does not matter to APNs; a batch holding a retry until its
// not_before must not block fresh notifications); the in-flight bound pauses the consumer.
// One loop per lane, each with its own in-flight bound: the priority lane's records never wait behind bulk
// ones in Kafka or in the loop, and the APNs clients start them first (docs/pipeline.md, "Priority lanes").
let lanes = Lane.allCases.map { lane in
    StageLane(lane, topics: [topics.outbound(lane), topics.retry(lane)], processor: sender(lane),
              maxConcurrentBatches: 64, maxInFlight: maxInFlight)
}
// APNs credentials are reloaded from the pipeline file on SIGHUP and when it changes (FCM and webhook credentials
// load at start only).
let reloader: PipelineReloader
do {
    reloader = try PipelineReloader.forStage(setup) { config in try transport.reload(apps: config.apps) }
} catch {
    FileHandle.standardError.write(Data("herald-send: \(error)\n".utf8))
    exit(2)
}
exit(await setup.run(lanes: lanes, explain: setup.explainSink(redis), before: [router, reloader]))
